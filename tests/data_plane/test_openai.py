"""The OpenAI surface, Triton's generate extension and V2 text infer on the tiny test LLM,
served in process; plus sleep and wake, disconnects and the LLM metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from data_plane.app import watch_engines
from data_plane.state import Lifecycle
from runtimes.base import RuntimeOptions
from runtimes.llm.base import LLMRuntime
from runtimes.llm.hf import TransformersRuntime
from tests.data_plane.llm_app import LlmServer, llm_app, llm_server
from tests.llm_model import prompt, write_tiny_llm
from tests.models import write_python_model

pytestmark = pytest.mark.anyio

WAIT_S = 30.0
PROMPT = prompt("the", "fox", "dog", "river")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module scope: one server (one model load) for the module's tests


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_tiny_llm(root, "tiny")
    write_python_model(root, "echo")
    return root


@pytest.fixture(scope="module")
async def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LlmServer]:
    async with llm_app(repo, tmp_path_factory.mktemp("cache"), models=("tiny", "echo")) as app:
        yield app


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, **fields}


def events(body: bytes) -> list[Any]:
    """The data of each server-sent event; ``[DONE]`` kept as the string."""
    found = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        found.append(data if data == "[DONE]" else orjson.loads(data))
    return found


async def test_completion_greedy_usage_and_shape(server: LlmServer) -> None:
    first = await server.client.post("/v1/completions", json=completion())
    second = await server.client.post("/v1/completions", json=completion())
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    assert body["model"] == "tiny"
    [choice] = body["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None
    assert choice["finish_reason"] in ("length", "stop")
    assert choice["text"].strip()
    usage = body["usage"]
    assert usage["prompt_tokens"] == 4
    assert 1 <= usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # Greedy decoding is deterministic.
    assert second.json()["choices"][0]["text"] == choice["text"]


async def test_chat_uses_the_template_and_answers_as_assistant(server: LlmServer) -> None:
    request = {
        "model": "tiny",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "the fox"}]}],
        "max_completion_tokens": 5,
        "temperature": 0,
    }
    response = await server.client.post("/v1/chat/completions", json=request)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"].strip()
    # "<s>user the fox assistant": 5 tokens ("user" and "assistant" are <unk> here).
    assert body["usage"]["prompt_tokens"] == 5


async def test_streamed_text_equals_the_whole_answer(server: LlmServer) -> None:
    whole = (await server.client.post("/v1/completions", json=completion())).json()
    streamed = await server.client.post(
        "/v1/completions",
        json=completion(stream=True, stream_options={"include_usage": True}),
    )
    chat = await server.client.post(
        "/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "the fox"}],
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
        },
    )
    assert streamed.status_code == 200
    assert streamed.headers["content-type"].startswith("text/event-stream")
    found = events(streamed.content)
    assert found[-1] == "[DONE]"
    chunks, usage = found[:-2], found[-2]
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] in ("length", "stop")
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]

    chat_events = events(chat.content)
    assert chat_events[-1] == "[DONE]"
    assert chat_events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" for e in chat_events[:-1])
    assert chat_events[-2]["choices"][0]["finish_reason"] in ("length", "stop")


async def test_stop_string_ends_the_text_before_it(server: LlmServer) -> None:
    free = (await server.client.post("/v1/completions", json=completion(max_tokens=12))).json()
    words = free["choices"][0]["text"].split()
    stop = words[1]
    cut = (
        await server.client.post(
            "/v1/completions", json=completion(max_tokens=12, stop=[f" {stop}"])
        )
    ).json()
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop"
    text = free["choices"][0]["text"]
    assert choice["text"] == text[: text.index(f" {stop}")]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        pytest.param({"temperature": 3}, "temperature", id="temperature-range"),
        pytest.param({"top_p": 0}, "top_p", id="top-p-zero"),
        pytest.param({"max_tokens": 0}, "max_tokens", id="max-tokens-zero"),
        pytest.param({"max_tokens": "8"}, "max_tokens", id="max-tokens-string"),
        pytest.param({"n": 2}, "n", id="n-two"),
        pytest.param({"stop": [1]}, "stop", id="stop-not-strings"),
        pytest.param({"stream": "yes"}, "stream", id="stream-not-bool"),
        pytest.param({"frobnicate": 1}, "frobnicate", id="unknown-field"),
        pytest.param({"prompt": ""}, "prompt", id="empty-prompt"),
        pytest.param({"prompt": [1, 99999]}, "prompt", id="token-out-of-range"),
        pytest.param({"prompt": ["a", "b"]}, "prompt", id="two-prompts"),
        pytest.param({"max_tokens": 400}, "max_tokens", id="context-length"),
        pytest.param({"stream_options": {"include_usage": True}}, "stream_options", id="opts"),
    ],
)
async def test_bad_parameters_are_openai_400s(
    server: LlmServer, fields: dict[str, Any], param: str
) -> None:
    response = await server.client.post("/v1/completions", json=completion(**fields))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]
    if param == "max_tokens" and fields["max_tokens"] == 400:
        assert error["code"] == "context_length_exceeded"


async def test_unknown_and_non_llm_models(server: LlmServer) -> None:
    unknown = await server.client.post("/v1/completions", json=completion(model="nope"))
    not_llm = await server.client.post("/v1/completions", json=completion(model="echo"))
    bad_chat = await server.client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": []}
    )
    listing = (await server.client.get("/v1/models")).json()
    not_json = await server.client.post("/v1/completions", content=b"{nope")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    assert not_llm.status_code == 400 and not_llm.json()["error"]["param"] == "model"
    assert bad_chat.status_code == 400 and bad_chat.json()["error"]["param"] == "messages"
    assert [m["id"] for m in listing["data"]] == ["tiny"]
    assert listing["data"][0]["max_model_len"] == 256
    assert not_json.status_code == 400


async def test_triton_generate_and_v2_infer(server: LlmServer) -> None:
    whole = (await server.client.post("/v1/completions", json=completion())).json()
    text = whole["choices"][0]["text"]
    generated = await server.client.post(
        "/v2/models/tiny/generate",
        json={"text_input": PROMPT, "parameters": {"max_tokens": 8, "temperature": 0}},
    )
    excluded = await server.client.post(
        "/v2/models/tiny/versions/1/generate",
        json={
            "text_input": PROMPT,
            "sampling_parameters": '{"max_tokens": 8, "temperature": 0}',
            "exclude_input_in_output": True,
            "id": "r1",
        },
    )
    stream = await server.client.post(
        "/v2/models/tiny/generate_stream",
        json={"text_input": PROMPT, "parameters": {"max_tokens": 8, "temperature": 0}},
    )
    infer = await server.client.post(
        "/v2/models/tiny/infer",
        json={
            "inputs": [
                {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [PROMPT]},
                {
                    "name": "sampling_parameters",
                    "datatype": "BYTES",
                    "shape": [1],
                    "data": ['{"max_tokens": 8, "temperature": 0}'],
                },
            ]
        },
    )
    bad = await server.client.post("/v2/models/tiny/generate", json={"text_input": 3})
    not_json = await server.client.post("/v2/models/tiny/generate", content=b"{nope")
    not_object = await server.client.post("/v2/models/tiny/generate", content=b"[1]")
    assert generated.status_code == 200, generated.text
    assert generated.json() == {
        "model_name": "tiny",
        "model_version": "1",
        "text_output": PROMPT + text,
    }
    assert excluded.json()["text_output"] == text and excluded.json()["id"] == "r1"
    pieces = events(stream.content)
    assert all(p["model_name"] == "tiny" for p in pieces)
    assert "".join(p["text_output"] for p in pieces) == text
    assert infer.status_code == 200, infer.text
    [output] = infer.json()["outputs"]
    assert output["name"] == "text_output" and output["datatype"] == "BYTES"
    assert output["data"] == [PROMPT + text]
    assert bad.status_code == 400 and "text_input" in bad.json()["error"]
    assert not_json.status_code == 400
    assert "failed to parse the request JSON buffer" in not_json.json()["error"]
    assert not_object.status_code == 400
    assert not_object.json()["error"] == "the request body must be a JSON object"


async def test_sleep_refuses_and_wake_gives_the_same_output(server: LlmServer) -> None:
    client = server.client
    wakes = _sample(server, "zeroserve_llm_sleep_transition_seconds_count", transition="wake")
    before = (await client.post("/v1/completions", json=completion())).json()
    try:
        assert (await client.post("/v2/repository/models/tiny/sleep")).status_code == 200
        asleep = await client.post("/v1/completions", json=completion())
        index = (await client.post("/v2/repository/index", json={})).json()
        ready = await client.get("/v2/health/ready")
        assert (await client.post("/v2/repository/models/tiny/sleep")).status_code == 200
        assert (await client.post("/v2/repository/models/tiny/wake")).status_code == 200
        after = (await client.post("/v1/completions", json=completion())).json()
        # A load of the unchanged model wakes it too.
        await client.post("/v2/repository/models/tiny/sleep")
        assert (await client.post("/v2/repository/models/tiny/load")).status_code == 200
        reloaded = (await client.post("/v1/completions", json=completion())).json()
        unknown = await client.post("/v2/repository/models/nope/sleep")
    finally:
        await client.post("/v2/repository/models/tiny/wake")
    assert asleep.status_code == 503 and "sleeping" in asleep.json()["error"]["message"]
    assert asleep.headers["retry-after"] == "1"
    assert {"name": "tiny", "version": "1", "state": "SLEEPING"} in index
    assert ready.status_code == 200
    assert after["choices"] == before["choices"] == reloaded["choices"]
    assert _sample(server, "zeroserve_llm_sleep_transition_seconds_count", transition="wake") == (
        wakes + 2
    )
    assert unknown.status_code == 404


async def test_models_that_cannot_sleep_say_so(server: LlmServer) -> None:
    response = await server.client.post("/v2/repository/models/echo/sleep")
    assert response.status_code == 501
    assert "cannot sleep" in response.json()["error"]


async def test_metrics_use_vllm_names(server: LlmServer) -> None:
    first = _sample(server, "vllm:time_to_first_token_seconds_count")
    prompt_tokens = _sample(server, "vllm:prompt_tokens_total")
    await server.client.post("/v1/completions", json=completion())
    text = (await server.client.get("/metrics")).text
    assert _sample(server, "vllm:time_to_first_token_seconds_count") == first + 1
    assert _sample(server, "vllm:prompt_tokens_total") == prompt_tokens + 4
    for sample in (
        'vllm:num_requests_running{model_name="tiny"} 0.0',
        'vllm:num_requests_waiting{model_name="tiny"} 0.0',
        'vllm:time_to_first_token_seconds_count{model_name="tiny"}',
        'vllm:inter_token_latency_seconds_count{model_name="tiny"}',
        'vllm:e2e_request_latency_seconds_count{model_name="tiny"}',
        'vllm:generation_tokens_total{model_name="tiny"}',
        'vllm:request_success_total{finished_reason="length",model_name="tiny"}',
    ):
        assert sample in text, sample


def _sample(server: LlmServer, name: str, **labels: str) -> float:
    value = server.metrics.registry.get_sample_value(name, {"model_name": "tiny", **labels})
    return value or 0.0


async def test_a_client_that_leaves_aborts_its_generation(repo: Path, tmp_path: Path) -> None:
    """Streamed and not: once the client is gone the engine's running count drops to 0
    long before the 200 tokens asked for could have been generated."""
    async with llm_server(repo, tmp_path) as server:
        [tiny] = list(server.repository.all_serving())
        runtime = tiny.runtime
        assert isinstance(runtime, LLMRuntime)
        body = completion(max_tokens=200, prompt=prompt("the"), stream=True)
        async with server.client.stream("POST", "/v1/completions", json=body) as response:
            async for _ in response.aiter_bytes():
                break  # one chunk seen: the generation runs
            assert runtime.load_counts().running == 1
        await _until_idle(runtime)
        aborted = _sample(server, "vllm:request_success_total", finished_reason="abort")
        assert aborted == 1

        request = asyncio.create_task(
            server.client.post("/v1/completions", json={**body, "stream": False})
        )
        await _until(lambda: runtime.load_counts().running == 1)
        request.cancel()  # closes the connection
        await asyncio.gather(request, return_exceptions=True)
        await _until_idle(runtime)
        assert _sample(server, "vllm:request_success_total", finished_reason="abort") == 2


async def test_an_abort_mid_stream_ends_it_with_an_error_event(repo: Path, tmp_path: Path) -> None:
    """Sleep with no time to drain aborts the running generation: its stream ends with an
    error event and [DONE] (the status line has gone), never a cut connection."""
    async with llm_app(repo, tmp_path, exit_timeout_s=0.0) as server:
        [tiny] = list(server.repository.all_serving())
        runtime = tiny.runtime
        assert isinstance(runtime, LLMRuntime)
        body = completion(max_tokens=200, prompt=prompt("the"), stream=True)
        request = asyncio.create_task(server.client.post("/v1/completions", json=body))
        await _until(lambda: runtime.in_flight == 1)
        assert (await server.client.post("/v2/repository/models/tiny/sleep")).status_code == 200
        response = await request
    found = events(response.content)
    assert found[-1] == "[DONE]"
    assert found[-2]["error"]["type"] == "server_error"
    assert "aborted" in found[-2]["error"]["message"]


async def test_an_abort_mid_generate_stream_ends_it_with_an_error_event(
    repo: Path, tmp_path: Path
) -> None:
    """Triton's generate_stream the same way: its last event is ``{"error"}``."""
    async with llm_app(repo, tmp_path, exit_timeout_s=0.0) as server:
        [tiny] = list(server.repository.all_serving())
        runtime = tiny.runtime
        assert isinstance(runtime, LLMRuntime)
        body = {"text_input": prompt("the"), "parameters": {"max_tokens": 200}}
        request = asyncio.create_task(
            server.client.post("/v2/models/tiny/generate_stream", json=body)
        )
        await _until(lambda: runtime.in_flight == 1)
        assert (await server.client.post("/v2/repository/models/tiny/sleep")).status_code == 200
        response = await request
    assert response.status_code == 200
    found = events(response.content)
    assert all(e["model_name"] == "tiny" for e in found[:-1])
    assert "aborted" in found[-1]["error"]


async def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def _until_idle(runtime: LLMRuntime) -> None:
    await _until(lambda: runtime.load_counts().running == 0 and runtime.in_flight == 0)


async def test_a_dead_engine_fails_readiness_and_stops_the_server(server: LlmServer) -> None:
    """The watchdog (STYLE C15): readiness fails and the server's exit hook runs."""

    class _Dead(TransformersRuntime):
        @property
        def is_dead(self) -> bool:
            return True

    class _Repository:
        def all_serving(self) -> list[Any]:
            runtime = _Dead(name="tiny", version=1, options=RuntimeOptions())
            return [
                SimpleNamespace(
                    name="tiny", runtime=runtime, capabilities=runtime.resolve_capabilities()
                )
            ]

    lifecycle, exits = Lifecycle(), []
    await asyncio.wait_for(
        watch_engines(_Repository(), lifecycle, 0.01, lambda: exits.append(1)),  # type: ignore[arg-type]
        WAIT_S,
    )
    assert lifecycle.is_stopping and exits == [1]
