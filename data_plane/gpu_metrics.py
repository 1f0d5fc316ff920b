"""Triton's ``nv_gpu_*`` gauges, read from NVML at scrape time where NVML exists.

Only the GPUs this worker sees (``CUDA_VISIBLE_DEVICES``, :mod:`runtimes.nvml`) are
reported. NVML fails in ordinary ways: a reading that a MIG instance or a vGPU does not
support raises ``NotSupported``, a lost GPU raises on every call. Each device and each
reading is read on its own, so a failure drops that sample (with one warning per device and
reading) and the rest of the scrape still answers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, Final

from runtimes.nvml import open_nvml, visible_devices

logger = logging.getLogger(__name__)

_Reading = Callable[[ModuleType, Any], float]

_GAUGES: Final[tuple[tuple[str, str, _Reading], ...]] = (
    (
        "nv_gpu_utilization",
        "GPU utilization rate [0.0 - 1.0)",
        lambda nvml, h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
    ),
    (
        "nv_gpu_memory_total_bytes",
        "GPU total memory, in bytes",
        lambda nvml, h: float(nvml.nvmlDeviceGetMemoryInfo(h).total),
    ),
    (
        "nv_gpu_memory_used_bytes",
        "GPU used memory, in bytes",
        lambda nvml, h: float(nvml.nvmlDeviceGetMemoryInfo(h).used),
    ),
    (
        "nv_gpu_power_usage",
        "GPU power usage in watts",
        lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
    ),
    (
        "nv_gpu_power_limit",
        "GPU power management limit in watts",
        lambda nvml, h: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
    ),
)


class GpuMetrics:
    """Reads the visible GPUs through NVML (``nvidia-ml-py``); renders nothing without it.

    ``environ`` is where ``CUDA_VISIBLE_DEVICES`` is read (the process's by default).
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ
        self._warned: set[tuple[str, str]] = set()
        self._nvml, reason = open_nvml()
        if self._nvml is None:
            logger.debug("no GPU metrics: %s", reason)

    @property
    def is_available(self) -> bool:
        return self._nvml is not None

    def lines(self) -> Iterator[str]:
        nvml = self._nvml
        if nvml is None:
            return
        samples: dict[str, list[tuple[str, float]]] = {name: [] for name, _, _ in _GAUGES}
        try:
            devices = visible_devices(nvml, self._environ)
        except Exception as exc:  # pynvml.NVMLError: the driver went away
            self._warn_once("*", "devices", exc)
            devices = []
        for device in devices:
            for name, _, read in _GAUGES:
                try:
                    value = read(nvml, device.handle)
                except Exception as exc:  # pynvml.NVMLError_NotSupported, _GpuIsLost, ...
                    self._warn_once(device.uuid, name, exc)
                    continue
                samples[name].append((device.uuid, value))
        for name, help_text, _ in _GAUGES:
            yield f"# HELP {name} {help_text}"
            yield f"# TYPE {name} gauge"
            for uuid, value in samples[name]:
                yield f'{name}{{gpu_uuid="{uuid}"}} {value}'

    def _warn_once(self, uuid: str, reading: str, exc: Exception) -> None:
        # Scrapes come every few seconds; an unsupported reading stays unsupported.
        if (uuid, reading) in self._warned:
            return
        self._warned.add((uuid, reading))
        logger.warning("NVML cannot read %s of GPU %s: %s", reading, uuid, exc)
