"""What vLLM is told before its engine starts: how it starts processes, and how much of the
GPU it may take. Pure functions, so that they are tested without vLLM or a GPU.

**Start method.** vLLM's ``AsyncLLM`` runs its engine core in a child process, started with
``VLLM_WORKER_MULTIPROC_METHOD`` (``fork`` by default) unless torch reports CUDA initialised.
A zeroserve worker may have initialised CUDA without torch knowing (an ONNX Runtime CUDA
model loaded before), and a forked child then inherits a driver it cannot use. The worker
therefore always asks for ``spawn``; the worker's entry points (``zeroserve serve``,
``python -m data_plane``) guard ``__main__``, which spawn needs.

**Memory.** vLLM takes ``gpu_memory_utilization`` of the GPU's *total* memory (weights, then
KV cache in what is left) and refuses to start when less is free. Its default, 0.9, is the
whole GPU, while the placer packs models on a GPU by their ``memory_bytes``. The fraction is
therefore derived from the model's budget: ``memory_bytes / total``, rounded down.
"""

from __future__ import annotations

import logging
import math
from collections.abc import MutableMapping
from typing import Final

logger = logging.getLogger(__name__)

START_METHOD_ENV: Final = "VLLM_WORKER_MULTIPROC_METHOD"
START_METHOD: Final = "spawn"
DEFAULT_GPU_MEMORY_UTILIZATION: Final = 0.9
"""vLLM's own default: what a model without a budget takes."""


def use_spawn(environ: MutableMapping[str, str]) -> None:
    """Make vLLM start its engine core (and its GPU workers) with spawn, whatever the
    environment said: fork is unsafe once anything in the worker touched CUDA."""
    current = environ.get(START_METHOD_ENV)
    if current not in (None, START_METHOD):
        logger.warning(
            "%s=%s replaced by %s: a forked engine core fails where the worker initialised CUDA",
            START_METHOD_ENV,
            current,
            START_METHOD,
        )
    environ[START_METHOD_ENV] = START_METHOD


def gpu_memory_utilization(
    *, configured: float | None, memory_bytes: int, device_total_bytes: int | None
) -> float:
    """The ``gpu_memory_utilization`` vLLM gets.

    ``configured``: the config's own value, which wins; ``memory_bytes``: the model's GPU
    budget (0: none given); ``device_total_bytes``: the GPU's total memory (None: unknown).
    Without a budget the model takes vLLM's default. Raises ``ValueError`` with the reason
    when the fraction cannot be derived or exceeds the GPU.
    """
    if configured is not None:
        if configured > 1.0:
            raise ValueError(
                f"gpu_memory_utilization is a fraction of the GPU, at most 1, not {configured}"
            )
        return configured
    if memory_bytes <= 0:
        return DEFAULT_GPU_MEMORY_UTILIZATION
    if device_total_bytes is None or device_total_bytes <= 0:
        raise ValueError(
            "the GPU's total memory cannot be read (NVML), so gpu_memory_utilization cannot "
            "be derived from memory_bytes; set gpu_memory_utilization in the config"
        )
    if memory_bytes > device_total_bytes:
        raise ValueError(
            f"memory_bytes {memory_bytes} is more than the GPU's {device_total_bytes} bytes"
        )
    # Rounded down so that vLLM never takes more than the placer counted.
    fraction = math.floor(memory_bytes / device_total_bytes * 10_000) / 10_000
    if fraction <= 0.0:
        raise ValueError(
            f"memory_bytes {memory_bytes} is too small a share of the GPU's "
            f"{device_total_bytes} bytes for vLLM"
        )
    return fraction
