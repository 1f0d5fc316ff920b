"""The vLLM engine (the pinned ``zeroserve[vllm]``) on a GPU: the contract the transformers
engine meets on CPU, on the tiny test LLM built here (nothing downloaded).

Skipped, with the reason shown, where CUDA or vLLM is missing. Not run by the authors: no
machine with both was at hand (see README).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from foundation import model_config
from foundation.proto import model_config_pb2 as mc
from runtimes.base import RuntimeOptions, RuntimeState
from runtimes.llm.vllm import VllmRuntime
from runtimes.sampling import SamplingParams
from tests.llm_model import WORDS, prompt, write_tiny_llm

WAIT_S = 120.0
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


def _skip_without_cuda_and_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (pip install 'zeroserve[vllm]')")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


async def load_tiny_vllm(repo: Path, **parameters: str) -> VllmRuntime:
    """The tiny test LLM written under ``repo`` and loaded by vLLM on GPU 0, with config
    ``parameters``."""
    # hidden 256 over 4 heads: a head size every vLLM attention backend takes.
    model_dir = write_tiny_llm(repo, "tiny", hidden=256, parameters=parameters)
    config = model_config.read_config_file(model_dir)
    assert config is not None
    config.backend = "vllm"
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, count=1, gpus=[0])
    VllmRuntime.complete_config(model_dir / "1", config)
    runtime = VllmRuntime(name="tiny", version=1, options=RuntimeOptions(drain_timeout_s=0.0))
    await runtime.load(model_dir / "1", config, "cuda:0")
    return runtime


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VllmRuntime]:
    _skip_without_cuda_and_vllm()
    runtime = await load_tiny_vllm(
        tmp_path_factory.mktemp("repo"), gpu_memory_utilization="0.3", enforce_eager="true"
    )
    try:
        yield runtime
    finally:
        await runtime.unload()
    assert runtime.state is RuntimeState.UNLOADED


async def test_greedy_is_the_same_alone_and_in_a_batch_of_16(engine: VllmRuntime) -> None:
    ids = await engine.encode(prompt("the", "cat", "river"))
    alone = await engine.complete(ids, GREEDY)
    others = [await engine.encode(prompt(w, "fox")) for w in WORDS[:15]]
    together = await asyncio.gather(
        engine.complete(ids, GREEDY), *(engine.complete(o, GREEDY) for o in others)
    )
    assert together[0] == alone
    assert alone.finish_reason in ("length", "stop")


async def test_closing_the_stream_aborts_in_the_engine(engine: VllmRuntime) -> None:
    ids = await engine.encode(prompt("the"))
    stream = engine.generate(ids, SamplingParams(max_tokens=200, temperature=0.0))
    async with contextlib.aclosing(stream):
        async for delta in stream:
            if delta.tokens:
                break
        assert engine.load_counts().running == 1
    deadline = time.monotonic() + WAIT_S
    while engine.load_counts().running:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_sleep_then_wake_gives_the_same_output(engine: VllmRuntime) -> None:
    ids = await engine.encode(prompt("the", "moon"))
    before = await engine.complete(ids, GREEDY)
    await engine.sleep()
    assert engine.state is RuntimeState.SLEEPING
    await engine.wake()
    assert await engine.complete(ids, GREEDY) == before


def test_vllm_needs_a_gpu_device(tmp_path: Path) -> None:
    """Runs everywhere: on a CPU device the load fails with a clear reason."""
    config = model_config.parse_pbtxt('backend: "vllm"')
    runtime = VllmRuntime(name="x", version=1, options=RuntimeOptions())
    with pytest.raises(Exception, match="vLLM needs a GPU"):
        asyncio.run(runtime.load(tmp_path, config, "cpu"))
