"""LLM engines behind :class:`~runtimes.base.ModelRuntime`: transformers and vLLM.

``base`` holds :class:`LLMRuntime`, the interface the data plane's OpenAI and generate
surfaces drive (streaming ``generate``, ``abort``, ``sleep``/``wake``, engine load);
``sampling`` the request-side types; ``text`` incremental detokenization and stop strings;
``parameters`` the engine options read from the model config's ``parameters``; ``hf`` the
transformers runtime (continuous batching, CPU or GPU), whose engine (``hf_engine``) runs in
a process of its own (``engine_process``); and ``vllm`` the vLLM adapter (GPU, imported
lazily).
"""
