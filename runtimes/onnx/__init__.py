"""ONNX Runtime behind :class:`~runtimes.base.ModelRuntime`, one job per module.

``runtime`` (the :class:`OnnxRuntime` lifecycle), ``builder`` (providers and session options),
``engine_cache`` (opening through the warm engine cache), ``session`` (the tensors a session
serves and how their values cross), ``dtypes`` (datatype names and conversions), ``complete``
(auto-complete of the model configuration) and ``wire`` (reading the graph's interface
without its weights).
"""

from runtimes.onnx.runtime import OnnxRuntime

# The one name importers outside the package use (the registry, the tests that load models).
__all__ = ["OnnxRuntime"]
