"""Opening a session through the warm engine cache (:mod:`runtimes.cache.engines`).

The cache is kept per model, hardware and ORT version (and TensorRT's, with its profile):
the first load saves ONNX Runtime's optimized model, its weights as an external file; later
loads open that file with graph optimizations off, so ORT memory-maps the weights instead of
parsing and optimizing the graph again. With ``disable_prepacking`` on, such a load costs
milliseconds and the weights are paged in by the first inference. On GPUs the TensorRT
engine cache (and its timing cache) lives in the same folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any, Final

import onnxruntime as ort

from runtimes.cache.engines import EngineCache, hardware_identity, model_identity
from runtimes.cache.pins import Pin
from runtimes.errors import ModelLoadError
from runtimes.onnx.builder import SessionBuilder
from runtimes.onnx.providers import TENSORRT, profile_shapes, tensorrt_version

logger = logging.getLogger(__name__)

ENGINE_CACHE_RUNTIME: Final = "onnxruntime"
"""The folder of this runtime's engines under ``<cache_dir>/engines/``."""
_OPTIMIZED_MODEL: Final = "model.onnx"
_OPTIMIZED_WEIGHTS: Final = "model.onnx.data"


def open_with_engine_cache(
    builder: SessionBuilder, engines: EngineCache, path: Path, device: str
) -> tuple[ort.InferenceSession, Pin | None, bool]:
    """Open from the warm engine cache, or build and fill it; the engine comes pinned.

    Returns the session, the pin that keeps its engine from eviction (None when the engine
    could not be kept) and whether the cache served it. Raises ``OSError`` or
    ``LockTimeoutError`` when the cache itself cannot be used, and ``builder``'s
    :class:`ModelLoadError` when the model cannot be loaded.
    """
    key_parts = engine_key_parts(builder, path, device)
    key = engines.key(key_parts)
    if key_parts["providers"][0] == TENSORRT:
        # TensorRT writes (and rewrites, for new shapes) its engines in place and cannot
        # be saved as an optimized model: keep its own engine cache in the key folder.
        pin, hit = engines.shared(key)
        try:
            with engines.lock(key):
                providers = builder.providers(device, trt_cache=pin.path.parent / "trt")
                return builder.open(path, builder.session_options(), providers), pin, hit
        except BaseException:
            pin.release()
            raise
    providers = builder.providers(device, trt_cache=None)
    cached = engines.open(key)
    if cached is not None:
        optimized = cached.path.parent / _OPTIMIZED_MODEL
        _prefetch(cached.path.parent / _OPTIMIZED_WEIGHTS)
        options = builder.session_options()
        # The cached model was optimized when it was saved; doing it again costs time and
        # would read every weight.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            session = ort.InferenceSession(
                str(optimized), sess_options=options, providers=providers, enable_fallback=0
            )
            return session, cached, True
        except Exception as exc:
            cached.release()
            logger.warning(
                "engine cache %s of model %s is unusable (%s); rebuilding",
                optimized.parent,
                builder.model,
                exc,
                extra={"model": builder.model},
            )
            engines.discard(key)
    with engines.build(key) as build:
        options = _saving_to(builder.session_options(), build.path / _OPTIMIZED_MODEL)
        try:
            session = builder.open(path, options, providers)
        except ModelLoadError:
            # Saving the optimized model is what failed, or the model is bad: find out
            # without the cache (this raises the model's own error if it is bad).
            session = builder.open(path, builder.session_options(), providers)
            logger.warning(
                "model %s loads but its optimized form cannot be saved; no engine cache",
                builder.model,
                extra={"model": builder.model},
            )
            return session, None, False
        try:
            pin = build.publish({"key": key_parts, "source": str(path)})
        except OSError as exc:  # a full disk must not fail a load that worked
            logger.warning(
                "cannot keep the engine of model %s: %s",
                builder.model,
                exc,
                extra={"model": builder.model},
            )
            return session, None, False
    return session, pin, False


def engine_key_parts(builder: SessionBuilder, path: Path, device: str) -> dict[str, Any]:
    """What the engine of ``path`` on ``device`` depends on: the cache key's parts."""
    chosen = builder.providers(device, trt_cache=None)
    parts: dict[str, Any] = {
        "model": [path.name, model_identity(path.parent)],
        "onnxruntime": ort.__version__,
        "hardware": hardware_identity(device),
        "providers": [name for name, _ in chosen],
    }
    if chosen[0][0] == TENSORRT:
        # A TensorRT engine loads only in the TensorRT that built it, and covers only the
        # shapes of the profile it was built for.
        parts["tensorrt"] = {
            "version": tensorrt_version(),
            "profile": profile_shapes(builder.config),
        }
    return parts


def _saving_to(options: ort.SessionOptions, model: Path) -> ort.SessionOptions:
    """``options`` that also save the optimized model to ``model`` when the session opens."""
    options.optimized_model_filepath = str(model)
    # Weights go to a separate file so that later loads can memory-map them.
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", _OPTIMIZED_WEIGHTS
    )
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
    )
    return options


def _prefetch(path: Path) -> None:
    """Ask the kernel to start reading ``path`` into the page cache (no wait, no error).

    ORT memory-maps external weights; without this the first inference would fault them in
    page by page as the kernels reach them, slower than the readahead of a sequential read.
    """
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
