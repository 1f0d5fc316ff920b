"""How many GPUs this worker can use, counted through NVML (:mod:`runtimes.nvml`).

Never through CUDA: a ``cuInit`` here would leave the driver initialised in the worker, and
vLLM's engine core, forked or spawned from it later, must find CUDA untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from runtimes.nvml import count_gpus

logger = logging.getLogger(__name__)


def cuda_device_count(environ: Mapping[str, str] | None = None) -> int:
    """Number of GPUs this process sees (``CUDA_VISIBLE_DEVICES`` applied); 0 where there is
    no driver, no NVML or no GPU, with the reason logged."""
    found = count_gpus(environ)
    if found.reason:
        logger.info("no GPU for models: %s", found.reason)
    return found.count
