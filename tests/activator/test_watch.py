"""The replica watch: probes of stalled and suspended workers, and what their answers do to
the routing table; and the liveness probe itself against real servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

import pytest
from starlette.types import Receive, Scope, Send

from activator.health import StallPolicy
from activator.placements import PlacementView, ReplicaTable
from activator.watch import ReplicaWatch, probe_live
from foundation.records import Placement
from tests.activator.conftest import serve_asgi
from tests.activator.fakes import FakeStore, RecordingListener, settle
from tests.fakes import FakeClock
from tests.integration.conftest import free_port

pytestmark = pytest.mark.anyio

WAIT_S = 30.0
POLICY = StallPolicy(stall_after_s=1.0, probe_interval_s=2.0)


class ScriptedProbe:
    """A liveness probe whose answers the test gives, one per call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self.called = asyncio.Event()
        self.answers: asyncio.Queue[bool | Exception] = asyncio.Queue()

    async def __call__(self, url: str, timeout_s: float) -> bool:
        self.calls.append((url, timeout_s))
        self.called.set()
        answer = await self.answers.get()
        if isinstance(answer, Exception):
            raise answer
        return answer


class RecordingObserver:
    def __init__(self) -> None:
        self.suspended: list[str] = []

    def replicas_suspended(self, models: Iterable[str]) -> None:
        self.suspended += models


class Setup:
    def __init__(self, store: FakeStore, view: PlacementView, table: ReplicaTable) -> None:
        self.store = store
        self.view = view
        self.table = table
        self.probe = ScriptedProbe()
        self.observer = RecordingObserver()
        self.clock = FakeClock(0.0)
        self.watch = ReplicaWatch(
            table,
            view,
            self.probe,
            POLICY,
            probe_timeout_s=0.5,
            tick_s=0.01,
            observer=self.observer,
            clock=self.clock,
        )

    def workers(self, model: str) -> list[str]:
        return sorted(r.worker_id for r in self.table.replicas(model))

    def stall(self, worker_id: str, *, since: float) -> None:
        """One request waiting on every replica of ``worker_id`` since ``since``."""
        for model in self.table.models():
            for replica in self.table.replicas(model):
                if replica.worker_id == worker_id:
                    replica.awaiting_head = 1
                    replica.progress_at = since

    async def answer(self, is_live: bool | Exception) -> None:
        await self.probe.answers.put(is_live)
        await settle()


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    store, table = FakeStore(), ReplicaTable()
    await store.add_placement(Placement(model="a", worker_id="w1", url="http://127.0.0.1:1"))
    await store.add_placement(Placement(model="b", worker_id="w1", url="http://127.0.0.1:1"))
    await store.add_placement(Placement(model="a", worker_id="w2", url="http://127.0.0.1:2"))
    view = PlacementView(store, table, RecordingListener(), quarantine_s=60, resubscribe_delay_s=0)
    task = asyncio.create_task(view.run())
    assert await view.wait_synced(WAIT_S)
    state = Setup(store, view, table)
    try:
        yield state
    finally:
        await state.watch.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        view.close()


async def test_a_stalled_worker_that_fails_its_probe_leaves_routing_until_it_answers(
    setup: Setup,
) -> None:
    setup.stall("w1", since=0.0)
    setup.watch.tick(0.5)  # waiting, not yet stalled
    await settle()
    assert setup.probe.calls == []
    setup.watch.tick(1.0)
    setup.watch.tick(1.1)  # one probe at a time per worker
    await settle()
    assert setup.probe.calls == [("http://127.0.0.1:1", 0.5)]  # w2 is idle: not probed
    await setup.answer(False)
    assert setup.workers("a") == ["w2"]
    assert setup.workers("b") == []
    assert setup.observer.suspended == ["a", "b"]

    setup.watch.tick(2.5)  # suspended, probed at 1.0: not again yet
    await settle()
    assert len(setup.probe.calls) == 1
    setup.watch.tick(3.0)
    await settle()
    assert len(setup.probe.calls) == 2
    await setup.answer(False)  # still out
    assert setup.workers("a") == ["w2"]
    setup.watch.tick(5.0)
    await settle()
    await setup.answer(True)
    assert setup.workers("a") == ["w1", "w2"]
    assert setup.workers("b") == ["w1"]
    assert setup.observer.suspended == ["a", "b"]  # counted once


async def test_a_stalled_worker_that_answers_keeps_its_requests(setup: Setup) -> None:
    setup.stall("w1", since=0.0)
    setup.watch.tick(1.0)
    await settle()
    await setup.answer(True)
    assert setup.workers("a") == ["w1", "w2"]
    setup.watch.tick(2.0)  # still stalled (a long request), but probed lately
    await settle()
    assert len(setup.probe.calls) == 1
    setup.watch.tick(3.0)
    await settle()
    assert len(setup.probe.calls) == 2
    await setup.answer(True)
    assert setup.observer.suspended == []


async def test_a_head_from_any_model_shows_the_worker_runs(setup: Setup) -> None:
    setup.stall("w1", since=0.0)
    [b_replica] = setup.table.replicas("b")
    b_replica.awaiting_head = 0
    b_replica.progress_at = 0.9  # answered a request of b lately
    setup.watch.tick(1.5)
    await settle()
    assert setup.probe.calls == []


async def test_a_worker_gone_from_the_store_during_its_probe_is_forgotten(setup: Setup) -> None:
    setup.stall("w1", since=0.0)
    setup.watch.tick(1.0)
    await settle()
    await setup.store.remove_placement("a", "w1")
    await setup.store.remove_placement("b", "w1")
    await settle()
    setup.watch.tick(1.5)  # w1 is neither routed nor suspended: its state goes
    await setup.answer(False)
    assert setup.view.suspended() == {}
    assert setup.observer.suspended == []


async def test_a_failing_probe_is_logged_and_tried_again(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    setup.stall("w1", since=0.0)
    setup.watch.tick(1.0)
    await settle()
    await setup.answer(RuntimeError("a bug"))
    assert "probing worker w1 failed" in caplog.text
    setup.watch.tick(3.0)
    await settle()
    assert len(setup.probe.calls) == 2
    await setup.answer(True)


async def test_the_watch_ticks_on_its_own(setup: Setup) -> None:
    setup.stall("w1", since=-10.0)
    task = asyncio.create_task(setup.watch.run())
    try:
        async with asyncio.timeout(WAIT_S):
            await setup.probe.called.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# ---- the probe ----


async def _health(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "http"
    status = 200 if scope["path"] == "/v2/health/live" else 404
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def _unhealthy(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 503, "headers": []})
    await send({"type": "http.response.body", "body": b""})


@contextlib.asynccontextmanager
async def _silent_server() -> AsyncIterator[str]:
    """Accepts connections and reads, never answers: a stopped worker as a client sees it."""
    writers: list[asyncio.StreamWriter] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await reader.read()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_probe_live_is_true_only_for_a_200() -> None:
    async with serve_asgi(_health) as url:
        assert await probe_live(url, WAIT_S) is True
    async with serve_asgi(_unhealthy) as url:
        assert await probe_live(url, WAIT_S) is False


async def test_probe_live_is_false_for_silence_refusal_and_bad_urls() -> None:
    async with _silent_server() as url:
        assert await probe_live(url, 0.2) is False
    assert await probe_live(f"http://127.0.0.1:{free_port()}", WAIT_S) is False
    assert await probe_live("not a url", WAIT_S) is False
