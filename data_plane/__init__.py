"""The per-worker inference server.

Owns the Open Inference Protocol (KServe V2) HTTP API with Triton's extensions, the model
repository (names, versions, loaded runtimes), the dynamic batcher and the server's metrics.
"""
