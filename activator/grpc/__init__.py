"""The activator's gRPC endpoint: Triton's ``inference.GRPCInferenceService`` for every
registered model, with the HTTP endpoint's semantics over the same core (one buffer, one
activation per burst, least outstanding requests).

Modules: `server` (the listener and its options), `router` (each RPC answered or routed),
`unary` (one call to a replica), `stream` (ModelStreamInfer, one lane per model named on a
client stream), `worker_stream` (a lane's stream to its worker), `dispatch` (replica choice
and how a worker call failed), `channels` (one channel per worker), `status` (errors to
gRPC statuses), `wire` (the model name read from the bytes).
"""
