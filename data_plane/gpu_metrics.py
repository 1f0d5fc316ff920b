"""Triton's ``nv_gpu_*`` gauges, read from NVML at scrape time where NVML exists."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import ModuleType

logger = logging.getLogger(__name__)

_GAUGES = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes"),
    ("nv_gpu_power_usage", "GPU power usage in watts"),
    ("nv_gpu_power_limit", "GPU power management limit in watts"),
)


class GpuMetrics:
    """Reads every visible GPU through NVML (``nvidia-ml-py``); renders nothing without it."""

    def __init__(self) -> None:
        self._nvml: ModuleType | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as exc:  # ImportError, or NVMLError where there is no driver
            logger.debug("no GPU metrics: %s", exc)

    @property
    def is_available(self) -> bool:
        return self._nvml is not None

    def lines(self) -> Iterator[str]:
        nvml = self._nvml
        if nvml is None:
            return
        samples: dict[str, list[tuple[str, float]]] = {name: [] for name, _ in _GAUGES}
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            samples["nv_gpu_utilization"].append(
                (uuid, nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
            )
            samples["nv_gpu_memory_total_bytes"].append((uuid, float(memory.total)))
            samples["nv_gpu_memory_used_bytes"].append((uuid, float(memory.used)))
            samples["nv_gpu_power_usage"].append(
                (uuid, nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
            )
            samples["nv_gpu_power_limit"].append(
                (uuid, nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)
            )
        for name, help_text in _GAUGES:
            yield f"# HELP {name} {help_text}"
            yield f"# TYPE {name} gauge"
            for uuid, value in samples[name]:
                yield f'{name}{{gpu_uuid="{uuid}"}} {value}'
