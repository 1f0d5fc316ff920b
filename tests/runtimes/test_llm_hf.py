"""The transformers engine on the tiny test LLM: determinism under batching, abort, sleep,
its V2 infer contract and its load errors."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import pytest

from foundation import model_config
from runtimes.base import RuntimeOptions, RuntimeState
from runtimes.errors import (
    ContextLengthError,
    InvalidParameterError,
    ModelLoadError,
    ModelNotReadyError,
    QueueFullError,
)
from runtimes.llm.base import LLMRuntime
from runtimes.llm.hf import TransformersRuntime
from runtimes.sampling import SamplingParams
from tests.llm_model import WORDS, load_runtime, prompt, write_tiny_llm

pytestmark = pytest.mark.anyio

WAIT_S = 30.0
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llm(tmp_path_factory.mktemp("repo"), "tiny")


@pytest.fixture(scope="module")
async def engine(model_dir: Path) -> AsyncIterator[TransformersRuntime]:
    runtime = await load_runtime(model_dir)
    try:
        yield runtime
    finally:
        await runtime.unload()


async def test_config_is_completed_like_tritons_vllm_backend(model_dir: Path) -> None:
    config = model_config.read_config_file(model_dir)
    assert config is not None
    TransformersRuntime.complete_config(model_dir / "1", config)
    assert [i.name for i in config.input] == [
        "text_input",
        "sampling_parameters",
        "exclude_input_in_output",
    ]
    assert [o.name for o in config.output] == ["text_output"]
    assert config.instance_group[0].count == 64  # max_num_seqs: concurrent V2 infers


async def test_greedy_text_is_the_same_alone_and_in_a_batch_of_16(
    engine: TransformersRuntime,
) -> None:
    ids = await engine.encode(prompt("the", "cat", "river"))
    alone = await engine.complete(ids, GREEDY)
    others = [await engine.encode(prompt(w, "fox")) for w in WORDS[:15]]
    together = await asyncio.gather(
        engine.complete(ids, GREEDY), *(engine.complete(o, GREEDY) for o in others)
    )
    assert together[0] == alone
    assert alone.completion_tokens == 12 or alone.finish_reason == "stop"


async def test_sampled_text_varies_and_respects_max_tokens(engine: TransformersRuntime) -> None:
    ids = await engine.encode(prompt("the", "cat"))
    params = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9)
    texts = {(await engine.complete(ids, params)).text for _ in range(4)}
    assert len(texts) > 1
    assert all(len(t.split()) <= 10 for t in texts)


async def test_closing_the_stream_aborts_in_the_engine(engine: TransformersRuntime) -> None:
    ids = await engine.encode(prompt("the"))
    stream = engine.generate(ids, SamplingParams(max_tokens=200, temperature=0.0))
    async with contextlib.aclosing(stream):
        async for delta in stream:
            if delta.tokens:
                break
        assert engine.load_counts().running == 1
    assert engine.in_flight == 0
    await _until(lambda: engine.load_counts().running == 0)


async def test_admission_errors_come_before_the_stream(engine: TransformersRuntime) -> None:
    ids = await engine.encode(prompt("the"))
    with pytest.raises(ContextLengthError) as too_long:
        engine.generate(ids, SamplingParams(max_tokens=256))
    assert too_long.value.param == "max_tokens"
    with pytest.raises(InvalidParameterError):
        engine.generate([], GREEDY)
    with pytest.raises(InvalidParameterError):
        engine.generate([10_000], GREEDY)
    # No max_tokens: the completion may fill the context window.
    assert engine.resolve_max_tokens(6, None) == 250


async def test_the_pending_bound_refuses_with_503(model_dir: Path) -> None:
    runtime = await load_runtime(model_dir, max_pending_requests="1")
    try:
        ids = await runtime.encode(prompt("the"))
        first = runtime.generate(ids, SamplingParams(max_tokens=200, temperature=0.0))
        async with contextlib.aclosing(first):
            await first.__anext__()
            with pytest.raises(QueueFullError):
                runtime.generate(ids, GREEDY)
    finally:
        await runtime.unload()
    assert runtime.state is RuntimeState.UNLOADED


async def test_sleep_refuses_aborts_and_wake_restores_identical_output(model_dir: Path) -> None:
    runtime = await load_runtime(model_dir)
    try:
        ids = await runtime.encode(prompt("the", "moon"))
        before = await runtime.complete(ids, GREEDY)
        running = runtime.generate(ids, SamplingParams(max_tokens=200, temperature=0.0))
        async with contextlib.aclosing(running):
            await running.__anext__()
            # drain_timeout_s is 0: the running generation is aborted, not waited for.
            await runtime.sleep()
            rest = [d async for d in running]
        assert rest[-1].finish_reason == "abort"
        assert runtime.state is RuntimeState.SLEEPING
        assert runtime.load_counts().running == 0
        with pytest.raises(ModelNotReadyError):
            runtime.generate(ids, GREEDY)
        await runtime.sleep()  # idempotent
        await runtime.wake()
        assert _state(runtime) is RuntimeState.READY
        assert await runtime.complete(ids, GREEDY) == before
    finally:
        await runtime.unload()


async def test_v2_infer_contract(engine: TransformersRuntime) -> None:
    text = prompt("the", "star")
    ids = await engine.encode(text)
    completion = await engine.complete(ids, SamplingParams(max_tokens=5, temperature=0.0))
    batch = {
        "text_input": np.array([text.encode()], dtype=object),
        "sampling_parameters": np.array([b'{"max_tokens": 5, "temperature": 0}'], dtype=object),
    }
    with_prompt = await engine.infer(batch)
    without = await engine.infer({**batch, "exclude_input_in_output": np.array([True])})
    assert with_prompt["text_output"].tolist() == [(text + completion.text).encode()]
    assert without["text_output"].tolist() == [completion.text.encode()]


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        pytest.param({"max_num_seq": "4"}, "unknown parameter 'max_num_seq'", id="typo"),
        pytest.param({"max_num_seqs": "many"}, "must be a int", id="not-a-number"),
        pytest.param({"max_num_seqs": "0"}, "at least 1", id="below-minimum"),
        pytest.param({"dtype": "float8"}, "dtype", id="bad-dtype"),
    ],
)
async def test_bad_parameters_fail_the_load(
    model_dir: Path, parameters: dict[str, str], message: str
) -> None:
    config = model_config.read_config_file(model_dir)
    assert config is not None
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    runtime = TransformersRuntime(name="tiny", version=1, options=RuntimeOptions())
    with pytest.raises(ModelLoadError, match=message):
        await runtime.load(model_dir / "1", config, "cpu")
    assert runtime.state is RuntimeState.FAILED


async def test_a_folder_without_weights_fails_the_load(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    config = model_config.parse_pbtxt('backend: "transformers"')
    runtime = TransformersRuntime(name="x", version=1, options=RuntimeOptions())
    with pytest.raises(ModelLoadError, match="safetensors"):
        await runtime.load(tmp_path, config, "cpu")


def _state(runtime: LLMRuntime) -> RuntimeState:
    # A call, so that mypy does not keep the state it narrowed to before an await.
    return runtime.state


def test_is_an_llm_runtime() -> None:
    assert issubclass(TransformersRuntime, LLMRuntime)
    assert TransformersRuntime.capabilities.can_sleep


async def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_load_and_a_request_log_no_error(
    model_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """transformers sizes its CPU KV cache against the machine's memory through psutil and
    logs an ERROR without it: the llm extra brings it, so a healthy load logs none."""
    runtime = await load_runtime(model_dir)
    try:
        ids = await runtime.encode(prompt("the", "cat"))
        await runtime.complete(ids, GREEDY)
    finally:
        await runtime.unload()
    err = capfd.readouterr().err
    assert "psutil" not in err
    assert " ERROR " not in err
