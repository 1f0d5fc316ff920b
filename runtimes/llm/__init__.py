"""LLM engines behind :class:`~runtimes.base.ModelRuntime`: transformers and vLLM.

``base`` holds :class:`LLMRuntime`, what both engines share (streaming ``generate``,
``abort``, ``sleep``/``wake``, engine load), which the data plane reaches through the
capabilities it resolves at load (:mod:`runtimes.capabilities`); ``options`` the node-level
options only LLM runtimes take; ``text`` incremental detokenization and stop strings;
``parameters`` the engine options read from the model config's ``parameters``; ``hf`` the
transformers runtime (continuous batching, CPU or GPU), whose engine (``hf_engine``) runs in
a process of its own (``engine_process``); and ``vllm`` the vLLM adapter (GPU, imported
lazily). The request-side types are :mod:`runtimes.sampling`.
"""
