"""A gRPC server front end over an HTTP/2 server in Rust (h2corn), at a fraction of
grpc.aio's CPU per call.

Modules: `wire` (message framing, ``grpc-timeout``, status trailers, decompression),
`app` (calls as an ASGI app: dispatch by path, limits, deadlines, statuses over
transport-free handlers), `server` (h2corn embedded on the caller's loop, its HTTP/2
bounds from `GrpcLimits`).
"""
