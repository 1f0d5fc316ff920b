"""NVML cannot run without an NVIDIA driver, so these tests stand a fake pynvml module in."""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest

from data_plane.gpu_metrics import GpuMetrics


def _fake_nvml() -> ModuleType:
    module = ModuleType("pynvml")
    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = lambda h: b"GPU-1234"  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(total=80, used=20)  # type: ignore[attr-defined]
    module.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=50)  # type: ignore[attr-defined]
    module.nvmlDeviceGetPowerUsage = lambda h: 150_000  # type: ignore[attr-defined]
    module.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000  # type: ignore[attr-defined]
    return module


def test_renders_tritons_gpu_gauges(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    gpus = GpuMetrics()
    assert gpus.is_available
    text = "\n".join(gpus.lines())
    assert "# TYPE nv_gpu_memory_used_bytes gauge" in text
    assert 'nv_gpu_memory_used_bytes{gpu_uuid="GPU-1234"} 20.0' in text
    assert 'nv_gpu_utilization{gpu_uuid="GPU-1234"} 0.5' in text
    assert 'nv_gpu_power_usage{gpu_uuid="GPU-1234"} 150.0' in text


def test_renders_nothing_without_nvml(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    gpus = GpuMetrics()
    assert not gpus.is_available
    assert list(gpus.lines()) == []
