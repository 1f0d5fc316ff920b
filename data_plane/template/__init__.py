"""The worker template: a process that has already imported the data plane and forks a
worker per request from the local backend (`foundation.worker_template` is the wire).

A worker started with ``python -m data_plane`` spends most of its start importing (the
data plane, ONNX Runtime, numpy, uvicorn, gRPC); a forked one inherits all of that and only
builds its settings, app and sockets. The template never creates a thread, an event loop,
an ONNX Runtime session or a CUDA context: none of them survives ``fork``, so each worker
makes its own after it (`child`).
"""
