"""What only ``bench/compare.py --device cuda`` needs: checks, device memory, the host-to-device
copy rate, and the engine alone on the GPU (ONNX Runtime's CUDA provider, and PyTorch).

UNTESTED: written without a GPU (none on the development machine or in CI). Every entry point
fails with :class:`NoCudaError` and a message saying what is missing, rather than measuring
the CPU under a GPU label. NVML (``nvidia-ml-py``, the ``gpu`` extra) reads device memory;
torch (the ``torch`` extra, a CUDA build) times copies and runs the PyTorch baseline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from bench.engine import EngineResult

_COPY_BYTES: Final = 1 << 30


class NoCudaError(RuntimeError):
    """No usable CUDA device, driver or CUDA build of a library; the message says which."""


@dataclass(frozen=True)
class GpuInfo:
    """The device the run measures (results are saved under its name)."""

    index: int
    name: str
    memory_total_bytes: int
    driver: str
    ort_providers: tuple[str, ...]
    """The GPU providers ONNX Runtime offers here, preferred first (TensorRT, then CUDA)."""


def require_cuda(index: int = 0) -> GpuInfo:
    """The GPU at ``index``, or :class:`NoCudaError` saying why there is none to use."""
    try:
        import pynvml
    except ImportError:
        raise NoCudaError(
            "--device cuda needs nvidia-ml-py: pip install 'zeroserve[gpu]'"
        ) from None
    try:
        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
    except Exception as exc:
        raise NoCudaError(f"no NVIDIA driver or GPU (NVML: {exc})") from None
    if index >= count:
        raise NoCudaError(f"no GPU {index}: NVML sees {count}")
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    name = pynvml.nvmlDeviceGetName(handle)
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    providers = tuple(
        p for p in ("TensorrtExecutionProvider", "CUDAExecutionProvider") if p in available
    )
    if "CUDAExecutionProvider" not in providers:
        raise NoCudaError(
            "onnxruntime here has no CUDAExecutionProvider: pip install 'zeroserve[gpu]' "
            f"(onnxruntime-gpu); available: {sorted(available)}"
        )
    return GpuInfo(
        index=index,
        name=name.decode() if isinstance(name, bytes) else str(name),
        memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
        driver=str(pynvml.nvmlSystemGetDriverVersion()),
        ort_providers=providers,
    )


def memory_probe(index: int = 0) -> Callable[[], int | None]:
    """Reads the device's used memory (bytes, all processes) through NVML."""
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def used() -> int | None:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)

    return used


def host_to_device_gb_per_s(index: int = 0, size_bytes: int = _COPY_BYTES) -> float:
    """Pinned host memory to the device, median of 3 copies of ``size_bytes``, in GB/s."""
    torch = _torch_cuda()
    source = torch.empty(size_bytes, dtype=torch.uint8).pin_memory()
    target = torch.empty(size_bytes, dtype=torch.uint8, device=f"cuda:{index}")
    rates = []
    for _ in range(3):
        torch.cuda.synchronize(index)
        started = time.perf_counter()
        target.copy_(source, non_blocking=True)
        torch.cuda.synchronize(index)
        rates.append(size_bytes / 1e9 / (time.perf_counter() - started))
    del source, target
    torch.cuda.empty_cache()
    return float(np.median(rates))


class CudaEngine:
    """The engine alone on the GPU: an ``InferenceSession`` on the GPU providers, set up as
    the server sets one up for ``KIND_GPU`` (threads left to ONNX Runtime)."""

    def __init__(self, model_path: Path, info: GpuInfo, input_name: str, output_name: str):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 0
        options.inter_op_num_threads = 0
        providers: list[Any] = [(p, {"device_id": info.index}) for p in info.ort_providers]
        self._session: Any = ort.InferenceSession(
            str(model_path), sess_options=options, providers=providers
        )
        self._input, self._output = input_name, output_name

    def run(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self._session.run([self._output], {self._input: rows})[0])

    def measure(self, rows: np.ndarray, *, duration_s: float, warmup_s: float) -> EngineResult:
        return _timed_loop(lambda: self.run(rows), int(rows.shape[0]), duration_s, warmup_s)


def torch_engine_alone(
    widths: Sequence[int], batch: int, *, duration_s: float, warmup_s: float, index: int = 0
) -> EngineResult:
    """A PyTorch MLP of ``widths`` on the GPU (FP32, eval, no grad) at ``batch`` rows."""
    torch = _torch_cuda()
    model = _torch_mlp(torch, widths).to(f"cuda:{index}").eval()
    rows = torch.rand(batch, widths[0], device=f"cuda:{index}")

    def call() -> None:
        with torch.inference_mode():
            model(rows)
        torch.cuda.synchronize(index)

    return _timed_loop(call, batch, duration_s, warmup_s)


def _torch_cuda() -> Any:
    try:
        import torch
    except ImportError:
        raise NoCudaError("the PyTorch part needs torch: pip install 'zeroserve[torch]'") from None
    if not torch.cuda.is_available():
        raise NoCudaError("torch here has no CUDA (a CPU build, or no device visible)")
    return torch


def _torch_mlp(torch: Any, widths: Sequence[int]) -> Any:
    layers: list[Any] = []
    for index, (fan_in, fan_out) in enumerate(zip(widths, widths[1:], strict=False)):
        layers.append(torch.nn.Linear(fan_in, fan_out))
        if index < len(widths) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def _timed_loop(
    call: Callable[[], object], batch: int, duration_s: float, warmup_s: float
) -> EngineResult:
    deadline = time.perf_counter() + warmup_s
    while time.perf_counter() < deadline:
        call()
    latencies: list[int] = []
    started = time.perf_counter_ns()
    end = started + int(duration_s * 1e9)
    now = started
    while now < end:
        call()
        after = time.perf_counter_ns()
        latencies.append(after - now)
        now = after
    elapsed_s = (now - started) / 1e9
    p50, p90, p99 = np.percentile(np.asarray(latencies, dtype=np.float64), [50, 90, 99]) / 1e6
    return EngineResult(
        batch=batch,
        calls=len(latencies),
        duration_s=elapsed_s,
        throughput=batch * len(latencies) / elapsed_s,
        p50_ms=float(p50),
        p90_ms=float(p90),
        p99_ms=float(p99),
        cpu_cores=float("nan"),
        other_cpu_cores=float("nan"),
    )
