"""Which execution providers a GPU model gets, and their options. Pure, except the probe.

- **TensorRT** only where it really loads: onnxruntime-gpu lists ``TensorrtExecutionProvider``
  whenever it was built with it, even in an image without TensorRT, and a session asking for
  it there falls back (or fails) at every load, so the model never gets a warm engine. The
  probe (:func:`tensorrt_version`) looks for ORT's TensorRT provider library and loads
  ``libnvinfer``, once per process. Its version goes into the engine-cache key: an engine
  built by one TensorRT is not loadable by another.
- TensorRT's **optimisation profile** spans the config's batch sizes (1, the largest
  preferred size, ``max_batch_size``) over the inputs' fixed dims, so that a new batch size
  runs on the engine built at load instead of building another at its first inference;
  its **timing cache** (kept with the engines) makes any rebuild faster.
- **CUDA**'s memory arena grows without bound unless told: ``gpu_mem_limit`` holds it to the
  model's ``memory_bytes`` budget (the config parameter the control plane fills from the
  registration), growing only by what is requested (``kSameAsRequested``) so that the
  budget is not lost to power-of-two rounding.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
import logging
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Final, TypeAlias

from foundation.proto import model_config_pb2 as mc
from foundation.sequence_config import sequence_inputs

logger = logging.getLogger(__name__)

TENSORRT: Final = "TensorrtExecutionProvider"
CUDA: Final = "CUDAExecutionProvider"
CPU: Final = "CPUExecutionProvider"

Provider: TypeAlias = tuple[str, dict[str, str]]
"""An execution provider as ``InferenceSession`` takes it: name and provider options."""

_NVINFER_NAMES: Final = ("libnvinfer.so.10", "libnvinfer.so.8", "libnvinfer.so")
_ORT_TENSORRT_LIBRARY: Final = "libonnxruntime_providers_tensorrt.so"


def probe_tensorrt(
    *,
    load: Callable[[str], Any] = ctypes.CDLL,
    candidates: Sequence[str] | None = None,
    ort_library: Path | None = None,
) -> str | None:
    """TensorRT's version where ORT's TensorRT provider library exists and ``libnvinfer``
    loads; None (logged) otherwise.

    ``load`` opens a shared library by name or path; ``candidates`` are the names tried
    (default: the loader's own find, then the sonames of TensorRT 10 and 8, then the pip
    ``tensorrt_libs`` folder); ``ort_library`` is ORT's provider library (default: the one
    next to the installed onnxruntime).
    """
    library = _ort_tensorrt_library() if ort_library is None else ort_library
    if library is None or not library.exists():
        logger.info("no TensorRT: onnxruntime has no %s", _ORT_TENSORRT_LIBRARY)
        return None
    for name in _nvinfer_candidates() if candidates is None else candidates:
        try:
            nvinfer = load(name)
        except OSError:
            continue
        try:
            code = int(nvinfer.getInferLibVersion())
        except (AttributeError, OSError) as exc:
            logger.info("no TensorRT: %s has no version (%s)", name, exc)
            return None
        return str(code)
    logger.info("no TensorRT: libnvinfer cannot be loaded")
    return None


@functools.cache
def tensorrt_version() -> str | None:
    """:func:`probe_tensorrt` once per process: the libraries do not come and go."""
    return probe_tensorrt()


def choose_providers(
    *,
    device_id: str,
    available: Collection[str],
    tensorrt: str | None,
    config: mc.ModelConfig,
    memory_bytes: int,
    trt_cache: Path | None,
) -> list[Provider]:
    """The providers for ``cuda:<device_id>`` in order of preference, CPU last.

    ``available``: ORT's ``get_available_providers()``; ``tensorrt``: the probed TensorRT
    version (None: TensorRT does not load, so it is not chosen); ``memory_bytes``: the
    model's GPU budget (0: none); ``trt_cache``: the folder TensorRT keeps its engines and
    timing cache in (created), None for none.
    """
    providers: list[Provider] = []
    if TENSORRT in available and tensorrt is not None:
        providers.append((TENSORRT, tensorrt_options(device_id, config, trt_cache)))
    if CUDA in available:
        providers.append((CUDA, cuda_options(device_id, memory_bytes)))
    providers.append((CPU, {}))
    return providers


def cuda_options(device_id: str, memory_bytes: int) -> dict[str, str]:
    """The CUDA provider's options; with a budget, its arena is bounded by it."""
    options = {"device_id": device_id}
    if memory_bytes > 0:
        options |= {"gpu_mem_limit": str(memory_bytes), "arena_extend_strategy": "kSameAsRequested"}
    return options


def tensorrt_options(
    device_id: str, config: mc.ModelConfig, trt_cache: Path | None
) -> dict[str, str]:
    """The TensorRT provider's options: device, engine and timing caches, profile."""
    options = {"device_id": device_id}
    if trt_cache is not None:
        # Engines take minutes to build; the folder is keyed by model, GPU, driver, ORT and
        # TensorRT version (see runtimes.onnx.engine_cache).
        trt_cache.mkdir(parents=True, exist_ok=True)
        options |= {
            "trt_engine_cache_enable": "True",
            "trt_engine_cache_path": str(trt_cache),
            "trt_timing_cache_enable": "True",
            "trt_timing_cache_path": str(trt_cache),
        }
    return options | profile_shapes(config)


def profile_shapes(config: mc.ModelConfig) -> dict[str, str]:
    """``trt_profile_{min,opt,max}_shapes`` spanning the config's batch sizes; empty when
    the model does not batch (its shapes are the config's, fixed) or an input has a
    variable dim besides the batch (no bounds to give TensorRT, which then builds per
    shape)."""
    if config.max_batch_size <= 0:
        return {}
    largest = config.max_batch_size
    preferred = [b for b in config.dynamic_batching.preferred_batch_size if 0 < b <= largest]
    sizes = {"min": 1, "opt": max(preferred, default=largest), "max": largest}
    shapes: dict[str, list[str]] = {kind: [] for kind in sizes}
    for tensor in [*config.input, *sequence_inputs(config)]:
        dims = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
        if tensor.is_shape_tensor or any(d < 0 for d in dims):
            return {}
        for kind, batch in sizes.items():
            shapes[kind].append(f"{tensor.name}:{'x'.join(str(d) for d in [batch, *dims])}")
    if not shapes["min"]:
        return {}
    return {f"trt_profile_{kind}_shapes": ",".join(entries) for kind, entries in shapes.items()}


def _ort_tensorrt_library() -> Path | None:
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "capi" / _ORT_TENSORRT_LIBRARY


def _nvinfer_candidates() -> list[str]:
    names = [found] if (found := ctypes.util.find_library("nvinfer")) else []
    names += _NVINFER_NAMES
    spec = importlib.util.find_spec("tensorrt_libs")  # pip's tensorrt wheels
    if spec is not None and spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations)))
        names += [str(folder / name) for name in _NVINFER_NAMES]
    return names
