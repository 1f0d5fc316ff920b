"""On a GPU: models keep within their memory budgets, vLLM starts after CUDA is initialised in
the worker, and GPUs are counted without CUDA.

Skipped, with the reason shown, where there is no GPU, no onnxruntime-gpu or no vLLM. Not
run by the authors: no machine with a GPU was at hand when these were written.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from foundation.proto import model_config_pb2 as mc
from runtimes.errors import ModelLoadError
from runtimes.nvml import count_gpus, open_nvml
from runtimes.onnx import OnnxRuntime
from runtimes.sampling import SamplingParams
from tests.gpu.test_vllm import load_tiny_vllm
from tests.llm_model import prompt
from tests.models import load_runtime, read_config, write_onnx_mlp

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

MIB = 2**20
SIZES = (4096, 4096, 4096)
"""An MLP of 128 MiB of float32 weights."""
SLACK = 256 * MIB
"""What a process may hold on the device beyond its budget: the CUDA context and library
handles, which no allocator limit covers."""


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def _skip_without_gpu() -> None:
    found = count_gpus()
    if not found.count:
        pytest.skip(f"no GPU: {found.reason}")


def _skip_without_onnx_cuda() -> None:
    _skip_without_gpu()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDA provider (pip install 'zeroserve[gpu]')")


def _onnx_config(model_dir: Path, memory_bytes: int) -> mc.ModelConfig:
    config = read_config(model_dir)
    config.parameters["memory_bytes"].string_value = str(memory_bytes)
    return config


def _process_memory(pid: int) -> int:
    """Device memory NVML reports for process ``pid`` on GPU 0 (0 when none)."""
    nvml, reason = open_nvml()
    assert nvml is not None, reason
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return sum(int(p.usedGpuMemory or 0) for p in processes if p.pid == pid)
    finally:
        nvml.nvmlShutdown()


_FORK_AFTER_COUNT = """
import os, sys
from data_plane.devices import cuda_device_count
count = cuda_device_count()
pid = os.fork()
if pid == 0:
    import torch
    try:
        torch.zeros(1, device="cuda:0")
    except Exception as exc:
        print(exc, file=sys.stderr)
        os._exit(3)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(count, os.waitstatus_to_exitcode(status))
"""


def test_gpus_are_counted_without_initialising_cuda() -> None:
    """What counting must leave untouched is CUDA's initialisation, not libcuda's mapping
    (NVML may map libcuda; on the H200 machine it does): a process forked after the count, as
    vLLM's engine core is, must still be able to initialise CUDA and allocate."""
    _skip_without_gpu()
    pytest.importorskip("torch")
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
    result = subprocess.run(
        [sys.executable, "-c", _FORK_AFTER_COUNT],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    count, child = result.stdout.split()
    assert int(count) >= 1
    assert child == "0", result.stderr


async def test_the_cuda_arena_keeps_to_the_budget(tmp_path: Path) -> None:
    _skip_without_onnx_cuda()
    model_dir = write_onnx_mlp(tmp_path, "mlp", SIZES)
    with pytest.raises(ModelLoadError):
        # 64 MiB of arena cannot hold 128 MiB of weights.
        await load_runtime(
            OnnxRuntime, model_dir, device="cuda:0", config=_onnx_config(model_dir, 64 * MIB)
        )
    runtime = await load_runtime(
        OnnxRuntime, model_dir, device="cuda:0", config=_onnx_config(model_dir, 512 * MIB)
    )
    try:
        await runtime.infer({"INPUT0": np.ones((8, SIZES[0]), np.float32)})
        assert _process_memory(os.getpid()) <= 512 * MIB + SLACK
    finally:
        await runtime.unload()


async def test_vllm_starts_after_an_onnx_cuda_model_within_its_budget(tmp_path: Path) -> None:
    _skip_without_onnx_cuda()
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (pip install 'zeroserve[vllm]')")
    onnx_dir = write_onnx_mlp(tmp_path, "mlp", SIZES)
    # CUDA initialised in this process by ONNX Runtime, which torch does not know about:
    # a forked engine core would fail here.
    onnx = await load_runtime(
        OnnxRuntime, onnx_dir, device="cuda:0", config=_onnx_config(onnx_dir, 512 * MIB)
    )
    budget = 4096 * MIB
    try:
        llm = await load_tiny_vllm(tmp_path, memory_bytes=str(budget), enforce_eager="true")
    except BaseException:
        await onnx.unload()
        raise
    try:
        ids = await llm.encode(prompt("the", "cat"))
        result = await llm.complete(ids, SamplingParams(max_tokens=4, temperature=0.0))
        assert result.finish_reason in ("length", "stop")
        nvml, reason = open_nvml()
        assert nvml is not None, reason
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(0)
            others = [
                int(p.usedGpuMemory or 0)
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                if p.pid != os.getpid()
            ]
        finally:
            nvml.nvmlShutdown()
        # The engine core is the process besides this one on the GPU.
        assert others and max(others) <= budget + SLACK
        onnx_out = await onnx.infer({"INPUT0": np.ones((2, SIZES[0]), np.float32)})
        assert onnx_out["OUTPUT0"].shape == (2, SIZES[-1])
    finally:
        await llm.unload()
        await onnx.unload()
