"""LLM serving end to end: the tiny test LLM in the S3 test server, registered through the
admin API with ``min_replicas`` 0, driven with the official ``openai`` client through the
activator of a real ``zeroserve up`` (workers are real ``zeroserve serve`` processes).

Nothing asserts a duration: every wait polls with a deadline, and the platform (with its
workers) and moto_server are stopped when the module ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.data_plane.storage.s3_server import REGION, MotoServer, start_moto
from tests.integration.test_platform_e2e import AUTH, Platform, start_platform
from tests.llm_model import prompt, write_tiny_llm

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

WAIT_S = 120.0
PROMPT = prompt("the", "fox", "dog", "river")
SLEEP_AFTER_S = 1.0


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = start_moto(tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def bucket(moto: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny LLM under s3://<bucket>/repo/tiny: its version folder, no config.pbtxt (the
    registration carries the config, backend included)."""
    name = f"llm-{uuid.uuid4().hex[:12]}"
    s3 = moto.client()
    s3.create_bucket(Bucket=name)
    model_dir = write_tiny_llm(tmp_path_factory.mktemp("local"), "tiny")
    for path in sorted((model_dir / "1").iterdir()):
        s3.put_object(Bucket=name, Key=f"repo/tiny/1/{path.name}", Body=path.read_bytes())
    return name


@pytest.fixture(scope="module")
def platform(
    moto: MotoServer, bucket: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    started = start_platform(
        tmp_path_factory.mktemp("platform"),
        "llm",
        AWS_ENDPOINT_URL=moto.url,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION=REGION,
        ZEROSERVE_ALLOWED_STORAGE=f"s3://{bucket}",
    )
    try:
        yield started
    finally:
        started.stop()
        leftovers = started.wait_workers_gone()
        started.kill_leftovers()
        assert not leftovers, f"orphan workers {leftovers}"


@pytest.fixture(scope="module")
async def registered(platform: Platform, bucket: str) -> AsyncIterator[Platform]:
    """``tiny`` (never sleeps) and ``sleepy`` (sleeps after 1 s idle): the same files."""
    async with httpx.AsyncClient(timeout=WAIT_S) as http:
        for name, scaling in (
            ("tiny", {"min_replicas": 0, "idle_timeout_s": 600}),
            ("sleepy", {"min_replicas": 0, "idle_timeout_s": 600, "sleep_after_s": SLEEP_AFTER_S}),
        ):
            body = {
                "name": name,
                "storage_uri": f"s3://{bucket}/repo/tiny",
                "backend": "transformers",
                "config": {"parameters": {"max_model_len": {"string_value": "256"}}},
                "scaling": scaling,
            }
            response = await http.post(f"{platform.admin}/admin/v1/models", json=body, headers=AUTH)
            assert response.status_code == 201, response.text
    yield platform


@pytest.fixture
async def client(registered: Platform) -> AsyncIterator[Any]:
    async with openai.AsyncOpenAI(
        base_url=f"{registered.public}/v1", api_key="not-needed", max_retries=0, timeout=WAIT_S
    ) as api:
        yield api


async def greedy(client: Any, text: str = PROMPT, model: str = "tiny") -> str:
    response = await client.completions.create(
        model=model, prompt=text, max_tokens=8, temperature=0
    )
    assert response.choices[0].finish_reason in ("length", "stop")
    return str(response.choices[0].text)


async def test_completion_cold_starts_and_chat_answers(client: Any, registered: Platform) -> None:
    response = await client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=8, temperature=0
    )
    assert response.object == "text_completion"
    assert response.usage.prompt_tokens == 4
    assert 1 <= response.usage.completion_tokens <= 8
    assert response.choices[0].text.strip()
    chat = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "the fox"}],
        max_tokens=6,
        temperature=0,
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
    models = await client.models.list()
    assert {"tiny", "sleepy"} <= {m.id for m in models.data}
    async with httpx.AsyncClient(timeout=WAIT_S) as http:
        [timeline, *_] = (
            await http.get(f"{registered.admin}/admin/v1/models/tiny/activations", headers=AUTH)
        ).json()["activations"]
    assert timeline["outcome"] == "ready" and timeline["cache"] == "miss"


async def test_streaming_chunks_are_well_formed_and_end_with_done(
    client: Any, registered: Platform
) -> None:
    whole = await greedy(client)
    stream = await client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, usage = [], None
    async for chunk in stream:
        if chunk.choices:
            texts.append(chunk.choices[0].text)
        else:
            usage = chunk.usage
    assert "".join(texts) == whole
    assert usage is not None and usage.prompt_tokens == 4
    # The raw events through the activator: each a JSON chunk, the last one [DONE].
    request = {"model": "tiny", "messages": [{"role": "user", "content": "the fox"}],
               "max_tokens": 4, "temperature": 0, "stream": True}  # fmt: skip
    async with (
        httpx.AsyncClient(timeout=WAIT_S) as http,
        http.stream("POST", f"{registered.public}/v1/chat/completions", json=request) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line async for line in response.aiter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")


async def test_greedy_text_alone_equals_text_in_a_batch_of_16(client: Any) -> None:
    alone = await greedy(client)
    others = [prompt(word, "moon") for word in ("the", "fox", "dog", "cat", "bird") * 3]
    batch = await asyncio.gather(greedy(client), *(greedy(client, text) for text in others))
    assert batch[0] == alone


async def test_bad_parameters_are_openai_400s(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(model="tiny", prompt=PROMPT, temperature=7)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == "temperature"
    assert caught.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as too_long:
        await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1000)
    assert too_long.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        await client.completions.create(model="tiny", prompt=PROMPT, n=3)
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.completions.create(model="never-registered", prompt=PROMPT)
    assert unknown.value.body["code"] == "model_not_found"


async def test_a_client_that_disconnects_aborts_its_generation(
    client: Any, registered: Platform
) -> None:
    await greedy(client)  # placed
    worker = await _worker_url(registered, "tiny")
    aborted = await _metric(worker, "vllm:request_success_total", finished_reason="abort")
    stream = await client.completions.create(
        model="tiny", prompt=prompt("the"), max_tokens=240, temperature=0, stream=True
    )
    async for _ in stream:
        break  # the generation runs: one chunk arrived
    await stream.close()
    # The engine's own count of running requests drops once the abort reached it.
    await _eventually(
        lambda: _metric_is(worker, "vllm:num_requests_running", 0.0), "running to drop"
    )
    await _eventually(
        lambda: _metric_is(
            worker, "vllm:request_success_total", aborted + 1, finished_reason="abort"
        ),
        "the abort to be counted",
    )


async def test_an_idle_llm_sleeps_and_a_request_wakes_it_with_the_same_output(
    client: Any, registered: Platform
) -> None:
    before = await greedy(client, model="sleepy")
    async with httpx.AsyncClient(timeout=WAIT_S) as http:

        async def state() -> str:
            response = await http.get(f"{registered.admin}/admin/v1/models/sleepy", headers=AUTH)
            return str(response.json()["status"]["state"])

        await _eventually(lambda: _equals(state(), "sleeping"), "sleepy to fall asleep")
        after = await greedy(client, model="sleepy")
        timelines = (
            await http.get(f"{registered.admin}/admin/v1/models/sleepy/activations", headers=AUTH)
        ).json()["activations"]
    assert after == before
    woken = [t for t in timelines if t["outcome"] == "woken"]
    assert woken, timelines
    assert "wake" in [p["phase"] for p in woken[0]["phases"]]
    assert woken[0]["durations_s"]["wake"] >= 0


# ---- helpers ----


async def _worker_url(platform: Platform, model: str) -> str:
    async with httpx.AsyncClient(timeout=WAIT_S) as http:
        workers = (await http.get(f"{platform.admin}/admin/v1/workers", headers=AUTH)).json()
    [url] = [w["url"] for w in workers["workers"] if model in w["models"]]
    return str(url)


async def _metric(worker: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(timeout=WAIT_S) as http:
        text = (await http.get(f"{worker}/metrics")).text
    wanted = {"model_name": "tiny", **labels}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in wanted.items()):
                return float(sample.value)
    return 0.0


async def _metric_is(worker: str, name: str, value: float, **labels: str) -> bool:
    return await _metric(worker, name, **labels) == value


async def _equals(value: Awaitable[str], expected: str) -> bool:
    return await value == expected


async def _eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
