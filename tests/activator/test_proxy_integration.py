"""The activator under uvicorn on loopback, in front of real data plane workers.

Placements come from :class:`~tests.activator.fakes.FakeStore` (and once from the real
``MemoryStateStore``); activation is a recording fake, so each test decides when a worker
starts and when its placement is published. Failure modes of
workers (resets, silence, streams cut short) come from tiny raw TCP servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path

import anyio
import httpx
import numpy as np
import orjson
import pytest
from starlette.types import Receive, Scope, Send

from activator.access_log import ACCESS_LOGGER
from activator.app import ActivatorStore, create_app
from activator.buffer import Activate
from activator.settings import ActivatorSettings
from control_plane.store.memory import MemoryStateStore
from foundation.records import ModelRecord, Placement
from tests.activator.conftest import serve_app, serve_asgi
from tests.activator.fakes import FakeStore, RecordingActivate
from tests.integration.conftest import ServerProcess, free_port, start_server
from tests.models import load_mlp_weights, mlp_reference, write_onnx_mlp

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

WAIT_S = 60.0
"""Bound on any single wait in these tests; reached only when something is broken."""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_onnx_mlp(root, "mlp", sizes=(16, 32, 8), max_batch_size=8)
    return root


def _start_worker(repository: Path, log_dir: Path) -> ServerProcess:
    return start_server(
        repository, log_dir, "--model-control-mode", "explicit", "--load-model", "mlp"
    )


@pytest.fixture(scope="module")
def worker(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = _start_worker(repository, tmp_path_factory.mktemp("logs"))
    try:
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def _activator(
    store: ActivatorStore, activate: Activate, **overrides: object
) -> AsyncIterator[httpx.AsyncClient]:
    settings = ActivatorSettings(startup_sync_timeout_s=10.0, auth="off").model_copy(
        update=overrides
    )
    app = create_app(settings, store, activate, "act-test")
    async with (
        serve_app(app, settings) as url,
        httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client,
    ):
        yield client


def _json_row(x: np.ndarray) -> dict[str, object]:
    return {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": x.tolist()}]
    }


def _binary_infer(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    tensor = x.astype(np.float32).tobytes()
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": len(tensor)},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    )
    return header + tensor, {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


async def _raw(
    client: httpx.AsyncClient, method: str, path: str, **kwargs: object
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers (minus Date) and the body exactly as it came over the wire."""
    request = client.build_request(method, path, **kwargs)  # type: ignore[arg-type]
    # Sent by the caller, the id reaches the worker unchanged both ways, and its error
    # answers name it both ways; without one the activator would make one up.
    request.headers["X-Request-ID"] = "byte-exact-1"
    response = await client.send(request, stream=True)
    try:
        body = b"".join([chunk async for chunk in response.aiter_raw()])
    finally:
        await response.aclose()
    headers = [(k.lower(), v) for k, v in response.headers.raw if k.lower() != b"date"]
    return response.status_code, headers, body


# ---- proxying ----


async def test_requests_with_a_placement_are_proxied_byte_exact(worker: ServerProcess) -> None:
    store, activate = FakeStore(), RecordingActivate()
    store.register("mlp")
    await store.add_placement(Placement(model="mlp", worker_id="w1", url=worker.url))
    x = np.random.default_rng(0).standard_normal((2, 16), dtype=np.float32)
    binary, binary_headers = _binary_infer(x)
    json_body = orjson.dumps(_json_row(x[0]))
    cases: list[tuple[str, str, dict[str, object]]] = [
        (
            "POST",
            "/v2/models/mlp/infer",
            {"content": binary, "headers": {**binary_headers, "Accept-Encoding": "identity"}},
        ),
        (
            "POST",
            "/v2/models/mlp/versions/1/infer",
            {
                "content": gzip.compress(json_body),
                "headers": {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"},
            },
        ),
        ("GET", "/v2/models/mlp", {"headers": {"Accept-Encoding": "identity"}}),
        ("GET", "/v2/models/mlp/config?x=%2F", {"headers": {"Accept-Encoding": "gzip"}}),
        ("POST", "/v2/models/mlp/infer", {"content": b"{not json", "headers": {}}),
    ]
    async with (
        _activator(store, activate) as client,
        httpx.AsyncClient(base_url=worker.url, timeout=WAIT_S) as direct,
    ):
        for method, path, kwargs in cases:
            via_activator = await _raw(client, method, path, **kwargs)
            via_worker = await _raw(direct, method, path, **kwargs)
            assert via_activator == via_worker, path
        assert via_activator[0] == 400
    assert activate.calls == []
    # The last traffic report (sent at shutdown) shows the model, idle again.
    assert store.reports[-1].model == "mlp"
    assert store.reports[-1].in_flight == 0
    assert store.reports[-1].activator_id == "act-test"
    assert store.first_responses == []  # nothing was cold


async def test_a_binary_answer_is_correct_through_the_activator(
    worker: ServerProcess, repository: Path
) -> None:
    store = FakeStore()
    store.register("mlp")
    await store.add_placement(Placement(model="mlp", worker_id="w1", url=worker.url))
    x = np.random.default_rng(1).standard_normal((3, 16), dtype=np.float32)
    body, headers = _binary_infer(x)
    async with _activator(store, RecordingActivate()) as client:
        response = await client.post("/v2/models/mlp/infer", content=body, headers=headers)
    assert response.status_code == 200
    header_length = int(response.headers["inference-header-content-length"])
    output = np.frombuffer(response.content[header_length:], dtype=np.float32).reshape(3, 8)
    expected = mlp_reference(load_mlp_weights(repository / "mlp"), x)
    np.testing.assert_allclose(output, expected, rtol=1e-5, atol=1e-5)


async def test_with_the_memory_state_store(worker: ServerProcess) -> None:
    """The embedded wiring: the real in-memory store, activation through the store."""
    store = MemoryStateStore()
    await store.create_model(ModelRecord(name="mlp", storage_uri="file:///models/mlp"))
    requests = store.subscribe_activation_requests()
    row = _json_row(np.ones(16, dtype=np.float32))
    try:
        async with _activator(store, store.request_activation) as client:
            pending = asyncio.create_task(client.post("/v2/models/mlp/infer", json=row))
            async with asyncio.timeout(WAIT_S):
                assert await anext(requests) == "mlp"
            await store.add_placement(Placement(model="mlp", worker_id="w1", url=worker.url))
            response = await pending
            again = await client.post("/v2/models/mlp/infer", json=row)
        assert response.status_code == again.status_code == 200
        assert response.content == again.content
        [report] = await store.traffic("mlp")
        assert (report.activator_id, report.in_flight) == ("act-test", 0)
    finally:
        await requests.aclose()
        await store.close()


# ---- buffering and activation ----


async def test_a_burst_is_buffered_activated_once_and_answered(
    repository: Path, tmp_path: Path
) -> None:
    store, activate = FakeStore(), RecordingActivate()
    store.register("mlp")
    rows = np.random.default_rng(2).standard_normal((50, 16), dtype=np.float32)
    async with _activator(
        store, activate, release_concurrency=4, traffic_report_interval_s=0.02
    ) as client:
        tasks = [
            asyncio.create_task(client.post("/v2/models/mlp/infer", json=_json_row(row)))
            for row in rows
        ]
        late_worker: ServerProcess | None = None
        try:
            # All 50 are inside the activator (the traffic report says so), the control
            # plane was asked, and none has an answer: there is no worker yet.
            async with asyncio.timeout(WAIT_S):
                await store.wait_for_report(lambda r: r.in_flight == 50)
                await activate.wait_for_calls(1)
            assert not any(t.done() for t in tasks)
            late_worker = await anyio.to_thread.run_sync(
                partial(_start_worker, repository, tmp_path)
            )
            await store.add_placement(Placement(model="mlp", worker_id="w9", url=late_worker.url))
            async with asyncio.timeout(WAIT_S):
                responses = await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if late_worker is not None:
                await anyio.to_thread.run_sync(late_worker.stop)
    assert activate.calls == ["mlp"]
    expected = mlp_reference(load_mlp_weights(repository / "mlp"), rows)
    for row, response in zip(expected, responses, strict=True):
        assert response.status_code == 200
        output = response.json()["outputs"][0]["data"]
        np.testing.assert_allclose(output, row, rtol=1e-5, atol=1e-5)
    # One first response for the burst (sent at the latest by the report at shutdown).
    [first] = store.first_responses
    assert (first.model, first.worker_id, first.activator_id) == ("mlp", "w9", "act-test")
    assert first.waited_s > 0


async def test_overflow_is_429_and_a_failed_activation_503() -> None:
    store = FakeStore()
    store.register("mlp")
    gate = asyncio.Event()
    activate = RecordingActivate(error=RuntimeError("no worker has room for mlp"), gate=gate)
    row = _json_row(np.zeros(16, dtype=np.float32))
    async with _activator(store, activate, buffer_max_requests=1, retry_after_s=2) as client:
        first = asyncio.create_task(client.post("/v2/models/mlp/infer", json=row))
        async with asyncio.timeout(WAIT_S):
            await activate.called.wait()
        overflow = await client.post("/v2/models/mlp/infer", json=row)
        gate.set()
        failed = await first
    assert overflow.status_code == 429
    assert overflow.headers["retry-after"] == "2"
    assert overflow.json() == {
        "error": "model 'mlp' is starting and its request buffer is full (1 requests waiting)"
    }
    assert failed.status_code == 503
    assert failed.headers["retry-after"] == "2"
    assert failed.json() == {
        "error": "model 'mlp' could not be activated: no worker has room for mlp"
    }
    assert activate.calls == ["mlp"]


async def test_a_client_that_leaves_gives_its_place_in_the_buffer_up() -> None:
    store, activate = FakeStore(), RecordingActivate()
    store.register("m")
    connections: list[int] = []

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)

    async with (
        _raw_upstream(count) as url,
        _activator(
            store, activate, buffer_max_requests=1, traffic_report_interval_s=0.02
        ) as client,
    ):
        leaving = asyncio.create_task(client.post("/v2/models/m/infer", content=b"{}"))
        async with asyncio.timeout(WAIT_S):
            await store.wait_for_report(lambda r: r.in_flight == 1)
            leaving.cancel()  # the client gives up and closes its connection
            await asyncio.gather(leaving, return_exceptions=True)
            await store.wait_for_report(lambda r: r.in_flight == 0)
        # The place it held is free (the bound is 1), and it is never sent anywhere: only
        # the new request reaches the worker once the placement appears.
        staying = asyncio.create_task(client.post("/v2/models/m/infer", content=b"{}"))
        async with asyncio.timeout(WAIT_S):
            await store.wait_for_report(lambda r: r.in_flight == 1)
        await store.add_placement(Placement(model="m", worker_id="w", url=url))
        response = await staying
    assert response.status_code == 502  # the test worker hangs up on everything
    assert connections == [1]


async def test_no_replica_before_the_deadline_is_503() -> None:
    store, activate = FakeStore(), RecordingActivate()
    store.register("mlp")
    async with _activator(store, activate, activation_timeout_s=0.2) as client:
        response = await client.post(
            "/v2/models/mlp/infer", json=_json_row(np.zeros(16, dtype=np.float32))
        )
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json() == {"error": "model 'mlp' did not become ready within 0.2 s"}
    assert activate.calls == ["mlp"]


async def test_unknown_model_is_404_and_wakes_nothing() -> None:
    store, activate = FakeStore(), RecordingActivate()
    async with _activator(store, activate) as client:
        v2 = await client.post("/v2/models/nope/infer", content=b"{}")
        openai = await client.post("/v1/completions", json={"model": "nope", "prompt": "hi"})
    assert v2.status_code == openai.status_code == 404
    assert v2.json() == {"error": "model 'nope' is not registered"}
    assert activate.calls == []
    assert store.reports == []


# ---- replicas that vanish ----


async def test_a_dead_replica_is_retried_on_the_live_one(
    worker: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    store, activate = FakeStore(), RecordingActivate()
    store.register("mlp")
    await store.add_placement(
        Placement(model="mlp", worker_id="dead", url=f"http://127.0.0.1:{free_port()}")
    )
    await store.add_placement(Placement(model="mlp", worker_id="live", url=worker.url))
    row = _json_row(np.ones(16, dtype=np.float32))
    async with _activator(store, activate) as client:
        # Ties rotate, so one of the first two requests picks the dead replica.
        responses = [await client.post("/v2/models/mlp/infer", json=row) for _ in range(4)]
    assert [r.status_code for r in responses] == [200] * 4
    assert activate.calls == []
    assert "replica of mlp on worker dead refused a connection" in caplog.text


async def test_a_dead_only_replica_sends_the_request_back_to_the_buffer(
    worker: ServerProcess,
) -> None:
    store, activate = FakeStore(), RecordingActivate()
    store.register("mlp")
    await store.add_placement(
        Placement(model="mlp", worker_id="dead", url=f"http://127.0.0.1:{free_port()}")
    )
    row = _json_row(np.ones(16, dtype=np.float32))
    async with _activator(store, activate) as client:
        pending = asyncio.create_task(client.post("/v2/models/mlp/infer", json=row))
        async with asyncio.timeout(WAIT_S):
            await activate.called.wait()
        await store.add_placement(Placement(model="mlp", worker_id="live", url=worker.url))
        response = await pending
    assert response.status_code == 200
    assert activate.calls == ["mlp"]


async def test_a_buffered_request_released_to_a_dead_replica_waits_for_the_next(
    worker: ServerProcess,
) -> None:
    store, activate = FakeStore(), RecordingActivate()
    store.register("mlp")
    row = _json_row(np.ones(16, dtype=np.float32))
    async with _activator(store, activate) as client:
        pending = asyncio.create_task(client.post("/v2/models/mlp/infer", json=row))
        async with asyncio.timeout(WAIT_S):
            await activate.wait_for_calls(1)
            # Released to a replica that is gone already: back to the front of the buffer,
            # and since the model has no replica again, the control plane is asked again.
            await store.add_placement(
                Placement(model="mlp", worker_id="dead", url=f"http://127.0.0.1:{free_port()}")
            )
            await activate.wait_for_calls(2)
        await store.add_placement(Placement(model="mlp", worker_id="live", url=worker.url))
        response = await pending
    assert response.status_code == 200
    assert activate.calls == ["mlp", "mlp"]


# ---- streaming and upstream failures ----


async def test_event_streams_pass_through_unbuffered() -> None:
    second = asyncio.Event()
    received: list[bytes] = []

    async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        received.append(body)
        headers = [(b"content-type", b"text/event-stream"), (b"x-upstream", b"yes")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})
        await second.wait()
        await send({"type": "http.response.body", "body": b"data: two\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    request = b'{"stream": true, "model": "llm", "messages": [{"role": "user", "content": "hi"}]}'
    store = FakeStore()
    store.register("llm")
    async with serve_asgi(upstream) as upstream_url:
        await store.add_placement(Placement(model="llm", worker_id="u", url=upstream_url))
        async with (
            _activator(store, RecordingActivate()) as client,
            asyncio.timeout(WAIT_S),
            client.stream("POST", "/v1/chat/completions", content=request) as response,
        ):
            assert response.headers["content-type"] == "text/event-stream"
            assert response.headers["x-upstream"] == "yes"
            chunks = response.aiter_raw()
            first = b""
            while first != b"data: one\n\n":
                # The upstream holds its second event until this one got through.
                first += await anext(chunks)
            second.set()
            rest = b"".join([chunk async for chunk in chunks])
    assert rest == b"data: two\n\n"
    assert received == [request]


@contextlib.asynccontextmanager
async def _raw_upstream(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[str]:
    """A TCP server that reads one request per connection and then runs ``handle``."""
    writers: list[asyncio.StreamWriter] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    await reader.readexactly(int(line.split(b":")[1]))
            await handle(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    return


async def _stay_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()  # until the activator gives up and closes


async def _cut_event_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\nb\r\ndata: one\n\n\r\n"
    )
    await writer.drain()


async def _die_after_the_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    # As a killed worker does when the signal lands between its head and its body.
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n")
    await writer.drain()
    writer.write(b'{"model_name": "m"')
    await writer.drain()


async def _body_after_a_pause(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    body = b'{"model_name": "m", "outputs": []}'
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    writer.write(head % len(body))
    await writer.drain()
    await asyncio.sleep(0.1)
    writer.write(body[:10])
    await writer.drain()
    await asyncio.sleep(0.1)
    writer.write(body[10:])
    await writer.drain()
    await reader.read()


async def _proxied_to(url: str, **overrides: object) -> httpx.Response:
    store = FakeStore()
    store.register("m")
    await store.add_placement(Placement(model="m", worker_id="w", url=url))
    async with _activator(store, RecordingActivate(), **overrides) as client:
        return await client.post("/v2/models/m/infer", content=b"{}")


async def test_a_worker_that_hangs_up_after_the_request_is_502() -> None:
    async with _raw_upstream(_hang_up) as url:
        response = await _proxied_to(url)
    assert response.status_code == 502
    assert response.json()["error"].startswith(f"model 'm': worker {url} failed:")


async def test_a_worker_that_dies_between_head_and_body_is_502_not_a_cut_200() -> None:
    async with _raw_upstream(_die_after_the_head) as url:
        response = await _proxied_to(url)
    assert response.status_code == 502
    assert response.json()["error"].startswith(f"model 'm': worker {url} failed:")


async def test_a_small_body_that_comes_after_its_head_is_passed_on_whole() -> None:
    async with _raw_upstream(_body_after_a_pause) as url:
        response = await _proxied_to(url)
    assert response.status_code == 200
    assert response.json() == {"model_name": "m", "outputs": []}


async def test_a_buffered_request_that_fails_upstream_gives_its_slot_back() -> None:
    store, activate = FakeStore(), RecordingActivate()
    store.register("m")
    async with (
        _raw_upstream(_hang_up) as url,
        _activator(
            store, activate, release_concurrency=1, traffic_report_interval_s=0.02
        ) as client,
    ):
        pending = [
            asyncio.create_task(client.post("/v2/models/m/infer", content=b"{}")) for _ in range(2)
        ]
        async with asyncio.timeout(WAIT_S):
            await store.wait_for_report(lambda r: r.in_flight == 2)
        await store.add_placement(Placement(model="m", worker_id="w", url=url))
        # One slot: the second is released only once the first has failed and given it back.
        responses = await asyncio.gather(*pending)
    assert [r.status_code for r in responses] == [502, 502]


async def test_a_worker_that_does_not_answer_in_time_is_504() -> None:
    async with _raw_upstream(_stay_silent) as url:
        response = await _proxied_to(url, upstream_read_timeout_s=0.2)
    assert response.status_code == 504
    assert response.json() == {"error": f"model 'm': worker {url} did not answer within 0.2 s"}


async def test_an_event_stream_cut_mid_way_ends_with_an_error_event() -> None:
    async with _raw_upstream(_cut_event_stream) as url:
        response = await _proxied_to(url)
    assert response.status_code == 200
    assert response.content.startswith(b"data: one\n\nevent: error\ndata: ")
    error = orjson.loads(response.content.split(b"event: error\ndata: ")[1])
    assert error == {
        "error": f"worker {url}/v2/models/m/infer failed mid-stream: connection closed"
    }


async def test_a_full_connection_pool_is_503() -> None:
    connected, release = asyncio.Event(), asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.set()
        await release.wait()

    store = FakeStore()
    store.register("m")
    async with _raw_upstream(hold) as url:
        await store.add_placement(Placement(model="m", worker_id="w", url=url))
        async with _activator(
            store,
            RecordingActivate(),
            upstream_max_connections=1,
            upstream_max_keepalive_connections=1,
            upstream_pool_timeout_s=0.1,
        ) as client:
            held = asyncio.create_task(client.post("/v2/models/m/infer", content=b"{}"))
            async with asyncio.timeout(WAIT_S):
                await connected.wait()
            busy = await client.post("/v2/models/m/infer", content=b"{}")
            release.set()  # the worker hangs up on the held request
            hung_up = await held
    assert busy.status_code == 503
    assert busy.headers["retry-after"] == "1"
    assert busy.json() == {"error": "model 'm': every connection to its workers is busy"}
    assert hung_up.status_code == 502


async def test_a_silent_only_replica_leaves_routing_and_new_requests_wait_in_the_buffer(
    worker: ServerProcess,
) -> None:
    """A worker that takes requests and answers nothing (stopped) fails the liveness probe
    its stall brings; requests not yet sent then wait for an activation instead of joining
    the one stuck there, which keeps waiting for its own answer (here until its timeout)."""
    store, activate = FakeStore(), RecordingActivate()
    store.register("mlp")
    row = _json_row(np.ones(16, dtype=np.float32))
    async with _raw_upstream(_stay_silent) as silent:
        await store.add_placement(Placement(model="mlp", worker_id="stopped", url=silent))
        async with _activator(
            store,
            activate,
            upstream_stall_s=0.1,
            upstream_probe_timeout_s=0.2,
            upstream_probe_interval_s=0.2,
            upstream_read_timeout_s=10.0,
        ) as client:
            stuck = asyncio.create_task(client.post("/v2/models/mlp/infer", json=row))
            later = asyncio.create_task(_after_suspension(client, row))
            async with asyncio.timeout(WAIT_S):
                await activate.called.wait()  # the later request found no replica
            await store.add_placement(Placement(model="mlp", worker_id="live", url=worker.url))
            later_response = await later
            metrics = (await client.get("/metrics")).text
            stuck_response = await stuck
    assert later_response.status_code == 200
    assert activate.calls == ["mlp"]
    assert stuck_response.status_code == 504
    assert 'zeroserve_activator_replica_suspensions_total{model="mlp"} 1.0' in metrics


async def _after_suspension(client: httpx.AsyncClient, row: dict[str, object]) -> httpx.Response:
    """A request sent once the stuck one has made the activator probe and suspend."""
    async with asyncio.timeout(WAIT_S):
        while True:  # polled: the suspension is visible only in the metrics
            if "replica_suspensions_total{" in (await client.get("/metrics")).text:
                break
            await anyio.sleep(0.05)
    return await client.post("/v2/models/mlp/infer", json=row)


# ---- request ids and the access log ----


@pytest.fixture
def access_lines() -> Iterator[list[str]]:
    """The lines written to the access logger meanwhile."""
    written: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            written.append(record.getMessage())

    handler = Collect()
    logger = logging.getLogger(ACCESS_LOGGER)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield written
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _logged(line: str) -> dict[str, object]:
    entry: dict[str, object] = orjson.loads(line)
    return entry


async def test_the_worker_gets_the_request_id_and_its_error_names_it_as_the_log_does(
    worker: ServerProcess, access_lines: list[str]
) -> None:
    store = FakeStore()
    store.register("mlp")
    await store.add_placement(Placement(model="mlp", worker_id="w1", url=worker.url))
    async with _activator(store, RecordingActivate(), access_log_format="json") as client:
        broken = await client.post("/v2/models/mlp/infer", content=b"{not json")
        live = await client.get("/v2/health/live")
    assert live.status_code == 200
    assert broken.status_code == 400
    assert list(broken.json()) == ["error"]
    # The activator made the id up; the worker got it and named it in its error answer.
    request_id = broken.headers.get_list("x-request-id")
    [line] = access_lines
    entry = _logged(line)
    assert request_id == [entry["request_id"]]
    assert (entry["model"], entry["status"], entry["protocol"]) == ("mlp", 400, "http")
    assert entry["bytes_in"] == len(b"{not json")
    assert entry["bytes_out"] == len(broken.content)
    assert entry["waited"] is False


async def test_the_callers_request_id_and_traceparent_reach_the_worker() -> None:
    seen: list[dict[bytes, bytes]] = []

    async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(dict(scope["headers"]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    store = FakeStore()
    store.register("mlp")
    async with serve_asgi(upstream) as upstream_url:
        await store.add_placement(Placement(model="mlp", worker_id="u", url=upstream_url))
        async with _activator(store, RecordingActivate(), access_log=False) as client:
            answer = await client.post(
                "/v2/models/mlp/infer",
                content=b"{}",
                headers={"X-Request-ID": "caller-1", "traceparent": traceparent},
            )
            await client.post("/v2/models/mlp/infer", content=b"{}")
    assert answer.status_code == 200
    assert "x-request-id" not in answer.headers  # successes pass through untouched
    first, second = seen
    assert first[b"x-request-id"] == b"caller-1"
    assert first[b"traceparent"] == traceparent.encode()
    # With the log off, ids are still made up and passed on; no traceparent is.
    assert len(second[b"x-request-id"]) == 32
    assert b"traceparent" not in second


async def test_a_request_that_waited_for_its_activation_says_so(
    worker: ServerProcess, access_lines: list[str]
) -> None:
    store = FakeStore()
    store.register("mlp")

    async def activate(model: str) -> None:
        await store.add_placement(Placement(model=model, worker_id="w1", url=worker.url))

    x = np.random.default_rng(3).standard_normal(16, dtype=np.float32)
    async with _activator(store, activate, access_log_format="json") as client:
        cold = await client.post("/v2/models/mlp/infer", json=_json_row(x))
        warm = await client.post("/v2/models/mlp/infer", json=_json_row(x))
        unknown = await client.post("/v2/models/nobody/infer", json=_json_row(x))
    assert cold.status_code == warm.status_code == 200
    assert unknown.status_code == 404
    first, second, third = (_logged(line) for line in access_lines)
    assert first["waited"] is True
    assert isinstance(first["wait_ms"], float) and first["wait_ms"] > 0
    assert second["waited"] is False and second["wait_ms"] == 0
    # An unknown name is no model; the activator's own error names the id too.
    assert (third["model"], third["status"]) == (None, 404)
    assert unknown.headers["x-request-id"] == third["request_id"]
