"""NVML cannot run without an NVIDIA driver (there is none here), so these tests stand a fake
pynvml module in: two GPUs, one of which can be made to fail a reading or be lost."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from data_plane.gpu_metrics import GpuMetrics
from tests.data_plane.server_app import data_plane
from tests.nvml_fake import (
    NVMLError,
    NVMLErrorGpuIsLost,
    NVMLErrorNotSupported,
    fake_nvml as _fake_nvml,
)


def test_renders_tritons_gpu_gauges(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    gpus = GpuMetrics(environ={})
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


def test_only_the_visible_gpus_are_reported(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(("GPU-aaaa", "GPU-bbbb")))
    text = "\n".join(GpuMetrics(environ={"CUDA_VISIBLE_DEVICES": "1"}).lines())
    assert 'nv_gpu_memory_used_bytes{gpu_uuid="GPU-bbbb"} 21.0' in text
    assert "GPU-aaaa" not in text


def test_an_unsupported_reading_drops_that_sample_alone(monkeypatch: pytest.MonkeyPatch):
    # A MIG instance or a vGPU: NVML has no utilization or power for it.
    failing = {
        (0, "nvmlDeviceGetUtilizationRates"): NVMLErrorNotSupported,
        (0, "nvmlDeviceGetPowerUsage"): NVMLErrorNotSupported,
    }
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(("GPU-aaaa", "GPU-bbbb"), failing))
    text = "\n".join(GpuMetrics(environ={}).lines())
    assert 'nv_gpu_utilization{gpu_uuid="GPU-aaaa"}' not in text
    assert 'nv_gpu_power_usage{gpu_uuid="GPU-aaaa"}' not in text
    assert 'nv_gpu_memory_used_bytes{gpu_uuid="GPU-aaaa"} 20.0' in text
    assert 'nv_gpu_power_limit{gpu_uuid="GPU-aaaa"} 700.0' in text
    assert 'nv_gpu_utilization{gpu_uuid="GPU-bbbb"} 0.5' in text


@pytest.mark.anyio
async def test_metrics_answers_200_with_a_lost_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    # GPU 0 is lost (every call on it fails); GPU 1 answers.
    failing: dict[tuple[int, str], type[NVMLError]] = {
        (0, name): NVMLErrorGpuIsLost
        for name in (
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetEnforcedPowerLimit",
        )
    }
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(("GPU-aaaa", "GPU-bbbb"), failing))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "repo").mkdir()
    async with data_plane(tmp_path / "repo", tmp_path / "cache") as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert 'nv_gpu_memory_total_bytes{gpu_uuid="GPU-bbbb"} 80.0' in response.text
    assert "GPU-aaaa" not in response.text


def test_metrics_survive_nvml_failing_to_list_devices(monkeypatch: pytest.MonkeyPatch):
    module = _fake_nvml()

    def lost() -> int:
        raise NVMLError("driver gone")

    module.nvmlDeviceGetCount = lost  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", module)
    text = "\n".join(GpuMetrics(environ={}).lines())
    assert "# TYPE nv_gpu_utilization gauge" in text
    assert "gpu_uuid" not in text
