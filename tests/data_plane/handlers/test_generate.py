"""The generate handler, called directly on the tiny test LLM: whole and streamed answers,
closing or cancelling aborts the generation, and what is refused before a stream starts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from data_plane.errors import ModelNotReadyError, ServerStoppingError, UnknownModelError
from data_plane.handlers.generate import GenerateRequest, GenerateResponse
from data_plane.llm import NotALanguageModelError
from runtimes.sampling import SamplingParams
from tests.data_plane.server_app import Core, data_plane_core
from tests.llm_model import prompt, write_tiny_llm
from tests.models import write_python_model

pytestmark = pytest.mark.anyio

WAIT_S = 30.0
PROMPT = prompt("the", "fox", "dog", "river")
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
LONG = SamplingParams(max_tokens=200, temperature=0.0)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module scope: one core (one model load) for the module


@pytest.fixture(scope="module")
async def core(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Core]:
    root = tmp_path_factory.mktemp("repo")
    write_tiny_llm(root, "tiny")
    write_python_model(root, "echo")
    cache = tmp_path_factory.mktemp("cache")
    async with data_plane_core(root, cache, load_models=("tiny", "echo")) as core:
        yield core


async def test_the_whole_answer_follows_the_prompt_unless_excluded(core: Core):
    handler = core.handlers.generate
    model = handler.model("tiny")
    whole = await handler.generate(model, GenerateRequest(PROMPT, GREEDY, id="r1"))
    excluded = await handler.generate(model, GenerateRequest(PROMPT, GREEDY, exclude_input=True))
    assert whole == GenerateResponse("tiny", "1", "r1", PROMPT + excluded.text_output)
    assert excluded.text_output and excluded.id is None


async def test_the_stream_carries_the_new_text_in_pieces(core: Core):
    handler = core.handlers.generate
    model = handler.model("tiny", 1)
    whole = await handler.generate(model, GenerateRequest(PROMPT, GREEDY, exclude_input=True))
    stream = await handler.generate_stream(model, GenerateRequest(PROMPT, GREEDY))
    pieces = [piece async for piece in stream]
    assert len(pieces) > 1
    assert all((p.model_name, p.model_version) == ("tiny", "1") for p in pieces)
    assert "".join(p.text_output for p in pieces) == whole.text_output


async def test_closing_the_stream_aborts_the_generation(core: Core):
    handler = core.handlers.generate
    runtime = handler.model("tiny").runtime
    stream = await handler.generate_stream(handler.model("tiny"), GenerateRequest(PROMPT, LONG))
    await anext(stream)
    assert runtime.load_counts().running == 1
    await stream.aclose()
    await _until(lambda: runtime.load_counts().running == 0 and runtime.in_flight == 0)


async def test_cancelling_the_whole_answer_aborts_the_generation(core: Core):
    handler = core.handlers.generate
    runtime = handler.model("tiny").runtime
    task = asyncio.create_task(
        handler.generate(handler.model("tiny"), GenerateRequest(PROMPT, LONG))
    )
    await _until(lambda: runtime.load_counts().running == 1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    await _until(lambda: runtime.load_counts().running == 0 and runtime.in_flight == 0)


async def test_an_abort_mid_stream_raises_not_ready(tmp_path: Path):
    """Sleep with no time to drain aborts the running generation; its stream says so."""
    write_tiny_llm(tmp_path / "repo", "tiny")
    async with data_plane_core(
        tmp_path / "repo", tmp_path / "cache", load_models=("tiny",), exit_timeout_s=0.0
    ) as core:
        handler = core.handlers.generate
        stream = await handler.generate_stream(handler.model("tiny"), GenerateRequest(PROMPT, LONG))
        await anext(stream)
        rest = asyncio.create_task(_drain(stream))
        await core.handlers.repository.sleep("tiny")
        with pytest.raises(ModelNotReadyError, match="aborted"):
            await rest


async def _drain(stream: AsyncIterator[GenerateResponse]) -> None:
    async for _ in stream:
        pass


async def test_what_is_refused_before_a_stream_starts(core: Core):
    handler = core.handlers.generate
    with pytest.raises(UnknownModelError):
        handler.model("nope")
    with pytest.raises(NotALanguageModelError, match="'echo' \\(python\\) is not a language"):
        handler.model("echo")
    core.lifecycle.is_stopping = True
    try:
        with pytest.raises(ServerStoppingError):
            handler.check_accepting()
        with pytest.raises(ServerStoppingError):
            handler.model("tiny")
    finally:
        core.lifecycle.is_stopping = False


async def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)
