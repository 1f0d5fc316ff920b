"""gRPC transport: Triton's ``inference.GRPCInferenceService`` over the same handlers as the
HTTP routes (a second adapter, not a second server core).

Modules: `server` (the listener: the h2corn front end of `foundation.grpc_front`, or a
grpc.aio server with its options, as ``GrpcLimits.grpc_frontend`` says), `servicer` (each
RPC: parse, call a handler, encode; the RPC tables of both front ends), `stream`
(ModelStreamInfer), `codec` (infer requests and responses between protobuf and the
handlers' types), `messages` (the other answers as protobuf), `status` (data plane errors
to gRPC status codes). The shared-memory RPCs use the server's one registry
(``Handlers.shared_memory``), so a region registered over HTTP serves gRPC requests and the
other way round.
"""
