"""Which GPUs NVML shows this process. NVML needs an NVIDIA driver, which is absent here:
the tests stand a fake pynvml in (tests.nvml_fake), except the one that reads the real
library's absence."""

from __future__ import annotations

import sys

import pytest

from runtimes.nvml import (
    count_gpus,
    device_memory_total,
    open_nvml,
    parse_visible_devices,
    visible_devices,
)
from tests.nvml_fake import NVMLErrorGpuIsLost, fake_nvml

_GPUS = ("GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-cccc-3333")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", ()),
        ("0", ("0",)),
        ("2, 0", ("2", "0")),
        ("1,-1,0", ("1",)),
        ("GPU-bbbb,0", ("GPU-bbbb", "0")),
        ("MIG-5678", ("MIG-5678",)),
        ("NoDevFiles", ()),
    ],
)
def test_cuda_visible_devices_parse_as_cuda_reads_them(
    value: str | None, expected: tuple[str, ...] | None
):
    assert parse_visible_devices(value) == expected


@pytest.mark.parametrize(
    ("visible", "uuids"),
    [
        (None, _GPUS),
        ("", ()),
        ("2,0", ("GPU-cccc-3333", "GPU-aaaa-1111")),
        ("GPU-bbbb", ("GPU-bbbb-2222",)),
        ("1,7,0", ("GPU-bbbb-2222",)),  # CUDA stops at an index it lacks
        ("1,1", ("GPU-bbbb-2222",)),  # and at a repeated one
        ("GPU-", ()),  # a prefix of several is ambiguous
        ("MIG-x1,0", ("MIG-x1", "GPU-aaaa-1111")),
        ("MIG-unknown,0", ()),
    ],
)
def test_visible_devices_follow_cuda_visible_devices(visible: str | None, uuids: tuple[str, ...]):
    nvml = fake_nvml(_GPUS, mig=("MIG-x1",))
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    devices = visible_devices(nvml, environ)
    assert tuple(d.uuid for d in devices) == uuids
    assert [d.position for d in devices] == list(range(len(uuids)))


def test_a_lost_gpu_is_left_out():
    nvml = fake_nvml(_GPUS, failing={(0, "nvmlDeviceGetUUID"): NVMLErrorGpuIsLost})
    assert [d.uuid for d in visible_devices(nvml, {})] == ["GPU-bbbb-2222", "GPU-cccc-3333"]


def test_count_and_memory_through_nvml(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(_GPUS))
    assert count_gpus({"CUDA_VISIBLE_DEVICES": "0,2"}).count == 2
    empty = count_gpus({"CUDA_VISIBLE_DEVICES": ""})
    assert empty.count == 0
    assert "CUDA_VISIBLE_DEVICES=''" in empty.reason
    assert device_memory_total(0, {}) == 80
    assert device_memory_total(3, {}) is None


def test_without_nvml_there_are_no_gpus_and_a_reason(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert open_nvml() == (None, "nvidia-ml-py (pynvml) is not installed")
    found = count_gpus({})
    assert (found.count, found.reason) == (0, "nvidia-ml-py (pynvml) is not installed")
    assert device_memory_total(0, {}) is None


def test_the_real_nvml_without_a_driver_reports_why():
    """nvidia-ml-py is installed (dev extra) but this machine has no NVIDIA driver."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    nvml, reason = open_nvml()
    if nvml is not None:
        pytest.skip("an NVIDIA driver is present: this test is for machines without one")
    assert reason.startswith("NVML cannot start (")
