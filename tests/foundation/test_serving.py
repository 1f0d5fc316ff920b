"""The one bootstrap: signals fail readiness before listeners stop, listeners start in order
and stop in reverse (a failed start stops those already started), and an HTTP listener
serves its app's lifespan, drains in-flight requests and closes its socket. Real uvicorn
servers on loopback; the process-level behaviour (signals to real server processes,
draining, limits) is in ``tests/integration``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from foundation.serving import (
    Lifecycle,
    ServerStartError,
    StopSignals,
    graceful,
    serve,
)
from tests.foundation.listeners import loopback_listener

pytestmark = pytest.mark.anyio

WAIT_S = 30.0


# ---- signals ----


async def test_a_signal_fails_readiness_before_the_listeners_stop() -> None:
    lifecycle = Lifecycle()
    signals = StopSignals(lifecycle, propagation_s=3600)
    signals.handle(signal.SIGTERM)
    assert lifecycle.is_stopping
    assert not signals.stop.is_set()
    # A second signal does not wait for propagation.
    signals.handle(signal.SIGTERM)
    assert signals.stop.is_set()


async def test_without_propagation_a_signal_stops_at_once() -> None:
    lifecycle = Lifecycle()
    signals = StopSignals(lifecycle)
    signals.handle(signal.SIGINT)
    assert lifecycle.is_stopping
    assert signals.stop.is_set()


async def test_readiness_failing_already_stops_at_once() -> None:
    """A server whose engine died fails readiness and signals itself: nothing to wait for."""
    lifecycle = Lifecycle(is_stopping=True)
    signals = StopSignals(lifecycle, propagation_s=3600)
    signals.handle(signal.SIGTERM)
    assert signals.stop.is_set()


async def test_the_stop_comes_after_the_propagation_pause() -> None:
    signals = StopSignals(Lifecycle(), propagation_s=0.05)
    signals.handle(signal.SIGTERM)
    async with asyncio.timeout(WAIT_S):
        await signals.stop.wait()


async def test_signals_once_stopping_go_to_on_repeat() -> None:
    repeated: list[int] = []
    signals = StopSignals(Lifecycle(), on_repeat=repeated.append)
    signals.handle(signal.SIGTERM)
    signals.handle(signal.SIGINT)
    signals.handle(signal.SIGTERM)
    assert repeated == [signal.SIGINT, signal.SIGTERM]


# ---- the HTTP listener ----


def _app(events: list[str], *, hold: asyncio.Event | None = None) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        events.append("startup")
        yield
        events.append("shutdown")

    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    async def slow(request: Request) -> PlainTextResponse:
        events.append("slow started")
        assert hold is not None
        await hold.wait()
        return PlainTextResponse("slow done")

    return Starlette(routes=[Route("/", hello), Route("/slow", slow)], lifespan=lifespan)


def _is_refused(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=WAIT_S).close()
    except ConnectionRefusedError:
        return True
    return False


async def test_a_listener_serves_its_app_and_closes_its_socket() -> None:
    events: list[str] = []
    async with loopback_listener(_app(events)) as listener:
        assert events == ["startup"]
        async with httpx.AsyncClient(base_url=listener.url, timeout=WAIT_S) as client:
            assert (await client.get("/")).text == "hello"
    assert events == ["startup", "shutdown"]
    assert _is_refused(listener.url)


async def test_a_listener_drains_the_requests_in_flight() -> None:
    events: list[str] = []
    hold = asyncio.Event()
    listener = loopback_listener(_app(events, hold=hold))
    async with httpx.AsyncClient(timeout=WAIT_S) as client, asyncio.timeout(WAIT_S):
        await listener.__aenter__()
        request = asyncio.create_task(client.get(f"{listener.url}/slow"))
        while "slow started" not in events:  # noqa: ASYNC110 - the app's events are a list
            await asyncio.sleep(0.01)
        stopping = asyncio.create_task(listener.__aexit__(None, None, None))
        # Stopping: new connections are refused while the request in flight waits.
        while not _is_refused(listener.url):  # noqa: ASYNC110 - nothing to wait on but the port
            await asyncio.sleep(0.01)
        assert not request.done()
        hold.set()
        response = await request
        await stopping
    assert response.text == "slow done"
    assert events == ["startup", "slow started", "shutdown"]


async def test_a_failed_startup_is_a_start_error_and_frees_the_port() -> None:
    @contextlib.asynccontextmanager
    async def failing(app: Starlette) -> AsyncIterator[None]:
        raise RuntimeError("no model repository")
        yield

    listener = loopback_listener(Starlette(lifespan=failing))
    with pytest.raises(ServerStartError, match="the test server did not start"):
        async with listener:
            pytest.fail("entered a listener whose startup failed")
    assert _is_refused(listener.url)


# ---- several listeners in one process ----


class RecordingListener:
    """A listener that records its start and stop, and may fail to start."""

    def __init__(self, name: str, events: list[str], *, fails: bool = False) -> None:
        self.name = name
        self.events = events
        self.fails = fails

    async def __aenter__(self) -> RecordingListener:
        if self.fails:
            raise ServerStartError(server=self.name, reason="refused")
        self.events.append(f"{self.name} started")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.events.append(f"{self.name} stopped")


class RecordingGrpcLikeServer:
    """What ``graceful`` takes, shaped as ``grpc.aio.Server``: ``start()``, ``stop(grace)``."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def start(self) -> None:
        self.events.append("second started")

    async def stop(self, grace: float | None) -> None:
        self.events.append(f"second stopped (grace {grace})")


async def test_a_failed_start_stops_the_listeners_already_started_in_reverse() -> None:
    events: list[str] = []
    with pytest.raises(ServerStartError, match="the third server did not start"):
        await serve(
            RecordingListener("first", events),
            RecordingListener("second", events),
            RecordingListener("third", events, fails=True),
            RecordingListener("fourth", events),
            lifecycle=Lifecycle(),
        )
    assert events == ["first started", "second started", "second stopped", "first stopped"]


async def test_a_signal_stops_every_listener_of_the_process_together() -> None:
    """An HTTP listener and a second server (as a gRPC server plugs in) on one loop; a real
    SIGTERM to this process fails readiness, then stops them, the last started first."""
    events: list[str] = []
    lifecycle = Lifecycle()
    http = loopback_listener(_app(events))

    class SignalWhenStarted(RecordingListener):
        async def __aenter__(self) -> RecordingListener:
            await super().__aenter__()
            # The handlers are installed before the first listener starts.
            os.kill(os.getpid(), signal.SIGTERM)
            return self

    async with asyncio.timeout(WAIT_S):
        await serve(
            http,
            graceful(RecordingGrpcLikeServer(events), grace_s=5.0),
            SignalWhenStarted("third", events),
            lifecycle=lifecycle,
        )
    assert lifecycle.is_stopping
    assert events == [
        "startup",
        "second started",
        "third started",
        "third stopped",
        "second stopped (grace 5.0)",
        "shutdown",
    ]
    assert _is_refused(http.url)
