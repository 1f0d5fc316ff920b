"""gRPC transport: Triton's ``inference.GRPCInferenceService`` over the same handlers as the
HTTP routes (a second adapter, not a second server core).

Modules: `settings` (port, message sizes, keepalive, bounds), `server` (the grpc.aio server
and its options), `servicer` (each RPC: parse, call a handler, encode), `stream`
(ModelStreamInfer), `codec` (infer requests and responses between protobuf and the
handlers' types), `messages` (the other answers as protobuf), `status` (data plane errors
to gRPC status codes). The shared-memory RPCs use the server's one registry
(``Handlers.shared_memory``), so a region registered over HTTP serves gRPC requests and the
other way round.
"""
