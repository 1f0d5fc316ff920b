"""The access log's HTTP middleware and the request-id middleware, in process over small
ASGI apps that play the routes' part (marking the model, noting a wait, setting the key id
as the authenticator does); the activator's full request path is in
test_proxy_integration.py and grpc/test_access_log.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import orjson
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from activator.access_log import (
    ACCESS_LOGGER,
    AccessLog,
    AccessLogFormat,
    AccessLogMiddleware,
    RequestIdMiddleware,
    note_activation_wait,
    request_id_of,
)
from activator.metrics import mark_model

pytestmark = pytest.mark.anyio

NOW = 1_700_000_000.25
"""The wall clock the middleware is given: 2023-11-14T22:13:20.250Z."""


class Lines(logging.Handler):
    """The access logger's lines, as written."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lines() -> Iterator[list[str]]:
    handler = Lines()
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def route(*, status: int = 200, body: bytes = b"answer", wait_s: float | None = None) -> ASGIApp:
    """An app that reads the body, marks model ``mlp``, notes a wait and answers; it
    echoes the request headers it got in ``x-seen-*`` answer headers."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        mark_model(scope, "mlp")
        if wait_s is not None:
            note_activation_wait(wait_s)
        seen = [(b"x-seen-" + name, value) for name, value in scope["headers"]]
        await send({"type": "http.response.start", "status": status, "headers": seen})
        await send({"type": "http.response.body", "body": body})

    return app


def logged(app: ASGIApp, log_format: AccessLogFormat = AccessLogFormat.TEXT) -> ASGIApp:
    inner = AccessLogMiddleware(app, AccessLog(log_format), clock=lambda: NOW)
    return RequestIdMiddleware(inner)


def with_state(app: ASGIApp, state: dict[str, object]) -> ASGIApp:
    """As uvicorn does: a copy of the lifespan state in every scope."""

    async def call(scope: Scope, receive: Receive, send: Send) -> None:
        scope["state"] = dict(state)
        await app(scope, receive, send)

    return call


def client(app: ASGIApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://activator")


def fields(line: str) -> dict[str, str]:
    pairs = [field.split("=", 1) for field in line.split(" ")]
    return {name: value for name, value in pairs}


async def test_a_text_line_says_who_called_what_and_how_it_went(lines: list[str]):
    app = with_state(logged(route(wait_s=0.25)), {"key_id": "key_4f2a"})
    async with client(app) as http:
        response = await http.post(
            "/v2/models/mlp/infer", content=b"12345", headers={"X-Request-ID": "req-1"}
        )
    assert response.status_code == 200
    [line] = lines
    assert fields(line) == {
        "time": "2023-11-14T22:13:20.250Z",
        "request_id": "req-1",
        "key_id": "key_4f2a",
        "model": "mlp",
        "protocol": "http",
        "method": "POST",
        "target": "/v2/models/mlp/infer",
        "status": "200",
        "latency_ms": fields(line)["latency_ms"],
        "waited": "yes",
        "wait_ms": "250.000",
        "bytes_in": "5",
        "bytes_out": str(len(b"answer")),
    }
    assert float(fields(line)["latency_ms"]) >= 0


async def test_a_json_line_is_one_object_with_nulls_for_what_is_unknown(lines: list[str]):
    async with client(with_state(logged(route(status=404), AccessLogFormat.JSON), {})) as http:
        await http.post("/v1/chat/completions", content=b"{}")
    [line] = lines
    entry = orjson.loads(line)
    assert entry["key_id"] is None
    assert entry["protocol"] == "openai"
    assert entry["status"] == 404
    assert entry["waited"] is False and entry["wait_ms"] == 0
    assert entry["bytes_in"] == 2
    assert len(entry["request_id"]) == 32


async def test_without_a_key_or_a_wait_the_text_line_says_so(lines: list[str]):
    async with client(logged(route())) as http:
        await http.get("/v2/models/mlp")
    [line] = lines
    assert fields(line)["key_id"] == "-"
    assert fields(line)["waited"] == "no"
    assert fields(line)["wait_ms"] == "0"


async def test_probes_and_scrapes_are_not_logged_and_everything_else_is(lines: list[str]):
    async with client(logged(route())) as http:
        for path in ("/v2/health/live", "/v2/health/ready", "/metrics", "/v2", "/v1/models"):
            await http.get(path)
    assert [fields(line)["target"] for line in lines] == ["/v2", "/v1/models"]


async def test_an_app_that_fails_is_logged_as_500(lines: list[str]):
    async def failing(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    async with client(logged(failing)) as http:
        with pytest.raises(RuntimeError):
            await http.get("/v2/models/mlp")
    [line] = lines
    assert fields(line)["status"] == "500"


async def test_values_that_would_break_the_line_are_quoted(lines: list[str]):
    async with client(logged(route())) as http:
        await http.get("/v2/models/a%20b=c")
    [line] = lines
    assert ' target="/v2/models/a b=c" ' in line


async def test_a_request_without_an_id_gets_one_and_passes_it_on(lines: list[str]):
    async with client(logged(route(status=503))) as http:
        response = await http.post("/v2/models/mlp/infer", content=b"x")
    request_id = response.headers["x-request-id"]
    assert len(request_id) == 32 and int(request_id, 16) >= 0
    # The app (the proxy, in the activator) got it among the request's headers.
    assert response.headers["x-seen-x-request-id"] == request_id
    assert fields(lines[0])["request_id"] == request_id


@pytest.mark.parametrize(
    "sent", [pytest.param("x" * 129, id="too-long"), pytest.param("a b", id="space")]
)
async def test_an_unusable_id_is_replaced(sent: str):
    async with client(RequestIdMiddleware(route(status=400))) as http:
        response = await http.get("/v2/models/mlp", headers={"X-Request-ID": sent})
    assert response.headers["x-request-id"] != sent
    assert response.headers.get_list("x-seen-x-request-id") == [response.headers["x-request-id"]]


async def test_successes_pass_through_and_an_answer_naming_the_id_is_not_named_twice():
    async def named(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"x-request-id", request_id_of(scope).encode())]  # type: ignore[union-attr]
        await send({"type": "http.response.start", "status": 400, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    async with client(RequestIdMiddleware(route())) as http:
        success = await http.get("/v2/models/mlp", headers={"X-Request-ID": "req-2"})
    async with client(RequestIdMiddleware(named)) as http:
        error = await http.get("/v2/models/mlp", headers={"X-Request-ID": "req-3"})
    assert "x-request-id" not in success.headers
    assert success.headers["x-seen-x-request-id"] == "req-2"
    assert error.headers.get_list("x-request-id") == ["req-3"]
