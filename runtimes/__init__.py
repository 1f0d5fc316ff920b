"""Inference engines behind one interface (:class:`runtimes.base.ModelRuntime`).

ONNX Runtime, PyTorch (TorchScript and torch.export) and custom Python models; each loads a
model version folder, runs batches of named numpy arrays, and frees what it held on unload.
LLM engines (``runtimes.llm``: transformers, vLLM) add streaming generation and sleep.
"""
