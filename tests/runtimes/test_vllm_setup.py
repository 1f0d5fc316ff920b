"""What vLLM is told before its engine starts: spawn, and a memory fraction from the model's
budget. vLLM itself needs a GPU (none here): the load test stands fake vLLM modules (and a
tokenizer) in that record what the runtime hands them, and a fake pynvml for the GPU's
total."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from foundation import model_config
from runtimes.base import RuntimeOptions
from runtimes.errors import ModelLoadError
from runtimes.llm.vllm import VllmRuntime
from runtimes.llm.vllm_setup import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    START_METHOD_ENV,
    gpu_memory_utilization,
    use_spawn,
)
from tests.nvml_fake import fake_nvml

GIB = 2**30


@pytest.mark.parametrize(
    ("configured", "memory_bytes", "total", "expected"),
    [
        (0.5, 0, None, 0.5),  # the config's own value wins
        (0.5, 8 * GIB, 80 * GIB, 0.5),
        (None, 0, None, DEFAULT_GPU_MEMORY_UTILIZATION),  # no budget: vLLM's default
        (None, 8 * GIB, 80 * GIB, 0.1),
        (None, 20 * GIB, 24 * GIB, 0.8333),  # rounded down, never above the budget
        (None, 24 * GIB, 24 * GIB, 1.0),
    ],
)
def test_the_fraction_follows_the_budget(
    configured: float | None, memory_bytes: int, total: int | None, expected: float
):
    fraction = gpu_memory_utilization(
        configured=configured, memory_bytes=memory_bytes, device_total_bytes=total
    )
    assert fraction == expected
    if configured is None and total:
        assert fraction * total <= memory_bytes


@pytest.mark.parametrize(
    ("configured", "memory_bytes", "total", "reason"),
    [
        (1.5, 0, None, "at most 1"),
        (None, 8 * GIB, None, "cannot be read"),
        (None, 30 * GIB, 24 * GIB, "more than the GPU's"),
        (None, 1, 24 * GIB, "too small"),
    ],
)
def test_a_fraction_that_cannot_be_had_is_refused(
    configured: float | None, memory_bytes: int, total: int | None, reason: str
):
    with pytest.raises(ValueError, match=reason):
        gpu_memory_utilization(
            configured=configured, memory_bytes=memory_bytes, device_total_bytes=total
        )


@pytest.mark.parametrize("before", [None, "fork", "spawn"])
def test_spawn_replaces_any_start_method(before: str | None):
    environ = {} if before is None else {START_METHOD_ENV: before}
    use_spawn(environ)
    assert environ == {START_METHOD_ENV: "spawn"}


def _fake_vllm(seen: dict[str, Any]) -> dict[str, ModuleType]:
    """vllm's modules as the runtime imports them, and transformers' AutoTokenizer; building
    the engine records the engine arguments and the start method in force, then fails as a
    machine without a GPU would."""

    def engine_args(**arguments: Any) -> dict[str, Any]:
        return arguments

    def from_engine_args(arguments: dict[str, Any]) -> None:
        seen.update(arguments, start_method=os.environ.get(START_METHOD_ENV))
        raise RuntimeError("fake vLLM: no GPU here")

    modules = {
        name: ModuleType(name)
        for name in (
            "transformers",
            "vllm",
            "vllm.engine",
            "vllm.engine.arg_utils",
            "vllm.v1",
            "vllm.v1.engine",
            "vllm.v1.engine.async_llm",
        )
    }
    modules["transformers"].AutoTokenizer = type(  # type: ignore[attr-defined]
        "AutoTokenizer", (), {"from_pretrained": staticmethod(lambda *a, **k: object())}
    )
    modules["vllm.engine.arg_utils"].AsyncEngineArgs = engine_args  # type: ignore[attr-defined]
    modules["vllm.v1.engine.async_llm"].AsyncLLM = type(  # type: ignore[attr-defined]
        "AsyncLLM", (), {"from_engine_args": staticmethod(from_engine_args)}
    )
    return modules


@pytest.mark.anyio
async def test_the_engine_starts_with_spawn_and_the_derived_fraction(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setenv(START_METHOD_ENV, "fork")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    seen: dict[str, Any] = {}
    for name, module in _fake_vllm(seen).items():
        monkeypatch.setitem(sys.modules, name, module)
    nvml = fake_nvml()
    nvml.nvmlDeviceGetMemoryInfo = lambda handle: type(  # type: ignore[attr-defined]
        "Memory", (), {"total": 80 * GIB, "used": 0}
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    config = model_config.parse_pbtxt('backend: "vllm"')
    config.parameters["memory_bytes"].string_value = str(8 * GIB)
    runtime = VllmRuntime(name="tiny", version=1, options=RuntimeOptions())
    with pytest.raises(ModelLoadError, match="fake vLLM: no GPU here"):
        await runtime.load(tmp_path, config, "cuda:0")
    assert seen["start_method"] == "spawn"
    assert seen["gpu_memory_utilization"] == 0.1
