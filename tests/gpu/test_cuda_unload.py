"""On CUDA, unload gives the device memory back.

Each test loads a 128 MiB MLP (two 4096x4096 float32 layers) on ``cuda:0``, checks that
device memory rose by most of that (so the model really sat on the GPU), unloads, and
checks that the memory in use is back within :data:`MARGIN_MIB` of its level before the
load. One warm-up cycle runs first: the CUDA context, cuBLAS/cuDNN handles and their
workspaces are per process and stay for its lifetime by design, so they belong to the
baseline. Memory is read device-wide (total - free) through torch, or NVML without torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from runtimes.base import ModelRuntime
from runtimes.onnx import OnnxRuntime
from runtimes.torch import TorchRuntime
from tests.models import (
    load_runtime,
    write_onnx_mlp,
    write_torch_export_mlp,
    write_torchscript_mlp,
)

pytestmark = pytest.mark.gpu

MARGIN_MIB = 64
"""How far above the pre-load level device memory may stay after unload."""
SIZES = (4096, 4096, 4096)
MODEL_MIB = 128


def _memory_probe() -> Callable[[], int]:
    """A function returning bytes in use on GPU 0; skips the test when CUDA is absent."""
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if torch is not None and torch.cuda.is_available():
        from runtimes.torch import device_memory_in_use_bytes

        return lambda: device_memory_in_use_bytes("cuda:0")
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
    except Exception as exc:  # ImportError, or NVMLError when there is no driver or GPU
        pytest.skip(f"no CUDA device visible (torch without CUDA, NVML: {exc!r})")
    return lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).used)


async def _cycle(runtime_class: type[ModelRuntime], model_dir: Path) -> None:
    runtime = await load_runtime(runtime_class, model_dir, device="cuda:0")
    await runtime.infer({"INPUT0": np.ones((8, SIZES[0]), np.float32)})
    await runtime.unload()


async def _assert_unload_frees_device_memory(
    runtime_class: type[ModelRuntime], model_dir: Path, used: Callable[[], int]
) -> None:
    await _cycle(runtime_class, model_dir)
    before = used()

    runtime = await load_runtime(runtime_class, model_dir, device="cuda:0")
    outputs = await runtime.infer({"INPUT0": np.ones((8, SIZES[0]), np.float32)})
    loaded = used()
    await runtime.unload()
    after = used()

    assert outputs["OUTPUT0"].shape == (8, SIZES[-1])
    mib = 2**20
    assert (loaded - before) / mib > MODEL_MIB * 0.75, (
        f"loading moved only {(loaded - before) / mib:.0f} MiB to the GPU; did it run on CPU?"
    )
    assert (after - before) / mib < MARGIN_MIB, (
        f"device memory before load {before / mib:.0f} MiB, loaded {loaded / mib:.0f} MiB, "
        f"after unload {after / mib:.0f} MiB"
    )


@pytest.mark.anyio
async def test_onnxruntime_cuda_unload_frees_device_memory(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
    used = _memory_probe()
    model_dir = write_onnx_mlp(tmp_path, "big", SIZES)
    await _assert_unload_frees_device_memory(OnnxRuntime, model_dir, used)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "writer", [write_torchscript_mlp, write_torch_export_mlp], ids=["torchscript", "export"]
)
async def test_torch_cuda_unload_frees_device_memory(
    tmp_path: Path, writer: Callable[..., Path]
) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is an optional extra")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    used = _memory_probe()
    model_dir = writer(tmp_path, "big", SIZES)
    await _assert_unload_frees_device_memory(TorchRuntime, model_dir, used)
