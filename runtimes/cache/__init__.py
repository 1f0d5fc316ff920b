"""The node cache's folders and file locks, and the warm engine caches runtimes keep there.

``layout`` names the folders under one cache root and writes them crash-safely, ``pins``
holds the node-wide locks that keep a folder in use from eviction, and ``engines`` is the
cache of built engines (ONNX Runtime's optimized model, TensorRT engines) that the ONNX
runtime reuses across loads. The data plane's model cache (``data_plane.storage``) fetches
models into the same root, under the same pins, and evicts models and engines alike.
"""
