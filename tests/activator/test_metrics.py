"""The activator's ``/metrics``: requests per registered model and status, their duration,
and the buffer's depth, read in process through the app's public routes."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Message

from activator.app import create_app
from activator.metrics import ActivatorMetrics, RequestMetricsMiddleware, mark_model
from activator.settings import ActivatorSettings
from tests.activator.conftest import asgi_client
from tests.activator.fakes import FakeStore, RecordingActivate

pytestmark = pytest.mark.anyio

INFER = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}


class RecordingObserver:
    def __init__(self) -> None:
        self.requests: list[tuple[str, int]] = []

    def request_finished(self, *, model: str, status: int, duration_s: float) -> None:
        assert duration_s >= 0
        self.requests.append((model, status))


def _settings(**overrides: object) -> ActivatorSettings:
    return ActivatorSettings(startup_sync_timeout_s=5.0, auth="off").model_copy(update=overrides)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_counts_requests_per_registered_model_and_status() -> None:
    store = FakeStore()
    store.register("mlp")
    activate = RecordingActivate(error=RuntimeError("no worker has room"))
    app = create_app(_settings(activation_timeout_s=5.0), store, activate, "act-1")
    async with asgi_client(app) as client:
        assert (await client.post("/v2/models/mlp/infer", json=INFER)).status_code == 503
        assert (await client.post("/v2/models/nope/infer", json=INFER)).status_code == 404
        assert (await client.get("/v2/health/ready")).status_code == 200
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)
    code = (("code", "503"), ("model", "mlp"))
    assert samples["zeroserve_activator_requests_total", code] == 1
    assert samples["zeroserve_activator_request_duration_seconds_count", (("model", "mlp"),)] == 1
    # Unknown names and the server's own paths are not counted, so they cannot add series.
    assert not [key for key in samples if ("model", "nope") in key[1]]
    assert sum(v for (name, _), v in samples.items() if name.endswith("requests_total")) == 1


async def test_openai_requests_count_under_the_bodys_model() -> None:
    store = FakeStore()
    store.register("llm")
    registry = CollectorRegistry()
    activate = RecordingActivate(error=RuntimeError("no room"))
    app = create_app(_settings(), store, activate, "act-1", registry=registry)
    async with asgi_client(app) as client:
        response = await client.post("/v1/completions", json={"model": "llm", "prompt": "hi"})
        assert response.status_code == 503
    value = registry.get_sample_value(
        "zeroserve_activator_requests_total", {"model": "llm", "code": "503"}
    )
    assert value == 1


async def test_buffer_depth_while_requests_wait_for_an_activation() -> None:
    store = FakeStore()
    store.register("mlp")
    gate = asyncio.Event()
    activate = RecordingActivate(error=RuntimeError("gave up"), gate=gate)
    app = create_app(_settings(activation_timeout_s=30.0), store, activate, "act-1")
    async with asgi_client(app) as client:
        waiting = [
            asyncio.create_task(client.post("/v2/models/mlp/infer", json=INFER)) for _ in range(3)
        ]
        await activate.wait_for_calls(1)
        deadline = asyncio.get_running_loop().time() + 10.0
        depth = 0.0
        while depth < 3 and asyncio.get_running_loop().time() < deadline:
            samples = _samples((await client.get("/metrics")).text)
            depth = samples.get(("zeroserve_activator_buffered_requests", (("model", "mlp"),)), 0)
            await asyncio.sleep(0.01)
        assert depth == 3
        gate.set()
        assert {(await task).status_code for task in waiting} == {503}
        samples = _samples((await client.get("/metrics")).text)
    assert ("zeroserve_activator_buffered_requests", (("model", "mlp"),)) not in samples


def _marked_app(metrics: ActivatorMetrics) -> Starlette:
    async def ok(request: Request) -> Response:
        mark_model(request.scope, request.path_params["name"])
        return PlainTextResponse("fine")

    async def broken(request: Request) -> Response:
        mark_model(request.scope, "mlp")
        raise RuntimeError("a bug")

    async def unmarked(request: Request) -> Response:
        return PlainTextResponse("not a model request")

    routes = [
        Route("/m/{name}", ok),
        Route("/broken", broken),
        Route("/other", unmarked),
    ]
    return Starlette(
        routes=routes, middleware=[Middleware(RequestMetricsMiddleware, metrics=metrics)]
    )


async def test_the_middleware_tells_the_observer_of_marked_requests_only() -> None:
    observer = RecordingObserver()
    metrics = ActivatorMetrics(CollectorRegistry(), observer=observer)
    transport = httpx.ASGITransport(app=_marked_app(metrics), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.get("/m/mlp")).status_code == 200
        assert (await client.get("/other")).status_code == 200
        assert (await client.get("/broken")).status_code == 500
    # An exception that escapes the app is recorded as the 500 the outer middleware sends.
    assert observer.requests == [("mlp", 200), ("mlp", 500)]
    assert (
        metrics.registry.get_sample_value(
            "zeroserve_activator_requests_total", {"model": "mlp", "code": "500"}
        )
        == 1
    )


@pytest.mark.parametrize(
    ("path", "body_start"),
    [
        pytest.param("/v2/models/mlp/infer", b'{"inputs": [', id="v2-infer"),
        pytest.param("/v1/completions", b'{"model": "mlp", "pro', id="openai"),
    ],
)
async def test_a_client_that_leaves_mid_body_is_a_499_not_a_500(
    path: str, body_start: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """A disconnect while the body is read is the client's doing: no 5xx in the metrics
    (the error-rate alert reads them) and no traceback in the log."""
    store = FakeStore()
    store.register("mlp")
    registry = CollectorRegistry()
    activate = RecordingActivate()
    app = create_app(_settings(), store, activate, "act-1", registry=registry)
    messages: list[Message] = [
        {"type": "http.request", "body": body_start, "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8080),
    }
    async with app.router.lifespan_context(app) as state:
        scope["state"] = dict(state or {})
        await app(scope, receive, send)
    assert sent[0]["status"] == 499
    assert activate.calls == []  # nothing woke for a request nobody waits for
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    for code in ("500", "499"):
        value = registry.get_sample_value(
            "zeroserve_activator_requests_total", {"model": "mlp", "code": code}
        )
        # The V2 path knows its model before the body; the OpenAI path learns it from it.
        expected = 1 if code == "499" and path.startswith("/v2") else None
        assert value == expected
