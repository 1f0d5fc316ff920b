"""The Redis store through outages, and two replicas sharing one Redis.

Each test gets its own redis-server, which it stops, restarts or freezes (SIGSTOP); the
fixture stops it even when the test fails. Waits are bounded generously; nothing asserts how
fast recovery is, only that it happens and in which order.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

from control_plane.store.errors import StoreUnavailableError
from control_plane.store.redis import RedisStateStore
from foundation.records import Placement, PlacementEvent, PlacementEventKind
from tests.control_plane.store.conftest import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

T = TypeVar("T")

WAIT_S = 20.0
"""Generous bound on any one wait; a healthy run takes well under a second."""
OP_TIMEOUT_S = 0.5
"""The stores' own per-call timeout, short so the frozen-server tests finish quickly."""

RESYNC = PlacementEvent(PlacementEventKind.RESYNC)


async def next_of(events: AsyncIterator[T]) -> T:
    async with asyncio.timeout(WAIT_S):
        return await anext(events)


def placement(model: str, worker_id: str = "w1") -> Placement:
    return Placement(model=model, worker_id=worker_id, url=f"http://{worker_id}:8000")


def added(p: Placement) -> PlacementEvent:
    return PlacementEvent(PlacementEventKind.ADDED, p)


class Replicas:
    """Stores opened on one server under one key prefix, as control-plane replicas are."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.prefix = f"test-{uuid.uuid4().hex[:12]}:"
        self.opened: list[RedisStateStore] = []

    def open(self, **options: Any) -> RedisStateStore:
        settings: dict[str, Any] = {
            "key_prefix": self.prefix,
            "timeout_s": OP_TIMEOUT_S,
            "keepalive_s": 0.2,
            "reconnect_backoff_initial_s": 0.05,
            "reconnect_backoff_max_s": 0.5,
        }
        settings.update(options)
        store = RedisStateStore(self.server.url, **settings)
        self.opened.append(store)
        return store


@pytest.fixture
async def replicas(own_redis_server: RedisServer) -> AsyncIterator[Replicas]:
    group = Replicas(own_redis_server)
    try:
        yield group
    finally:
        # Thawed so that closing does not wait on a frozen server; the server fixture
        # stops the process afterwards in any case.
        own_redis_server.thaw()
        for store in group.opened:
            await store.close()


async def test_subscriptions_resync_after_a_restart_and_then_get_new_events(
    replicas: Replicas, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="control_plane.store.redis")
    subscriber, publisher, bystander = replicas.open(), replicas.open(), replicas.open()
    events = subscriber.subscribe_placements()
    requests = subscriber.subscribe_activation_requests()
    try:
        assert await bystander.list_models() == []  # leaves an idle pooled connection
        assert await next_of(events) == RESYNC
        await publisher.request_activation("before")
        assert await next_of(requests) == "before"
        before = placement("before")
        await publisher.add_placement(before)
        assert await next_of(events) == added(before)

        await asyncio.to_thread(replicas.server.stop)
        with pytest.raises(StoreUnavailableError):
            async with asyncio.timeout(WAIT_S):
                await publisher.add_placement(placement("during"))
        await asyncio.to_thread(replicas.server.start)
        # A connection that died while idle in the pool is replaced, not handed out.
        assert await bystander.list_models() == []

        # The old connection died with the server: the subscriber must say so first.
        assert await next_of(events) == RESYNC
        after = placement("after")
        await publisher.add_placement(after)
        assert await next_of(events) == added(after)

        await publisher.request_activation("after")
        assert await next_of(requests) == "after"
    finally:
        await events.aclose()
        await requests.aclose()

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("placements subscription" in r.getMessage() for r in warnings)
    assert any("reconnected" in r.getMessage() for r in caplog.records)


async def test_calls_while_the_server_is_down_raise_store_unavailable(replicas: Replicas):
    store = replicas.open()
    await asyncio.to_thread(replicas.server.stop)
    calls: list[Callable[[], Awaitable[object]]] = [
        store.list_models,
        lambda: store.get_model("mlp"),
        lambda: store.add_placement(placement("mlp")),
        lambda: store.request_activation("mlp"),
        lambda: store.try_acquire_lease("cp-1", ttl_s=5),
        lambda: store.add_activation("mlp", {"queued": 0.0}, keep=3),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailableError) as caught:
            async with asyncio.timeout(WAIT_S):
                await call()
        assert str(replicas.server.port) in str(caught.value)

    await asyncio.to_thread(replicas.server.start)
    assert await store.list_models() == []


async def test_a_server_that_stops_answering_times_calls_out(replicas: Replicas):
    store = replicas.open()
    assert await store.list_models() == []  # a pooled connection exists
    replicas.server.freeze()
    try:
        calls: list[Callable[[], Awaitable[object]]] = [
            store.list_models,
            lambda: store.try_acquire_lease("cp-1", ttl_s=5),
        ]
        for call in calls:
            with pytest.raises(StoreUnavailableError, match="no answer within"):
                async with asyncio.timeout(WAIT_S):
                    await call()
    finally:
        replicas.server.thaw()
    assert await store.list_models() == []


class LogSeen(logging.Handler):
    """Sets ``seen`` when a WARNING containing ``needle`` is logged."""

    def __init__(self, needle: str) -> None:
        super().__init__(logging.WARNING)
        self.needle = needle
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        # Logged from the event loop's own thread, so setting the asyncio.Event is safe.
        if self.needle in record.getMessage():
            self.seen.set()


async def test_a_subscription_notices_a_silent_server_and_resyncs(replicas: Replicas):
    subscriber, publisher = replicas.open(), replicas.open()
    events = subscriber.subscribe_placements()
    gave_up = LogSeen("no answer to a keepalive ping")
    redis_logger = logging.getLogger("control_plane.store.redis")
    redis_logger.addHandler(gave_up)
    try:
        assert await next_of(events) == RESYNC
        replicas.server.freeze()

        async def following() -> PlacementEvent:
            return await anext(events)

        waiting = asyncio.create_task(following())
        try:
            # The keepalive ping goes unanswered: the subscriber gives the connection up.
            async with asyncio.timeout(WAIT_S):
                await gave_up.seen.wait()
        finally:
            replicas.server.thaw()
        async with asyncio.timeout(WAIT_S):
            assert await waiting == RESYNC
        p = placement("after")
        await publisher.add_placement(p)
        assert await next_of(events) == added(p)
    finally:
        redis_logger.removeHandler(gave_up)
        await events.aclose()


async def test_an_idle_subscription_stays_connected_across_keepalives(replicas: Replicas):
    subscriber, publisher = replicas.open(), replicas.open()
    events = subscriber.subscribe_placements()
    try:
        assert await next_of(events) == RESYNC

        async def following() -> PlacementEvent:
            return await anext(events)

        waiting = asyncio.create_task(following())
        # Several keepalive periods (0.2 s) pass with nothing published; each ping must be
        # answered and recognised, or the subscription would reconnect and yield RESYNC.
        await asyncio.sleep(1.5)
        p = placement("after-idle")
        await publisher.add_placement(p)
        async with asyncio.timeout(WAIT_S):
            assert await waiting == added(p)
    finally:
        await events.aclose()


async def test_one_replica_holds_the_lease_until_release_or_expiry(replicas: Replicas):
    first, second = replicas.open(timeout_s=10.0), replicas.open(timeout_s=10.0)
    assert await first.try_acquire_lease("cp-1", ttl_s=60)
    assert not await second.try_acquire_lease("cp-2", ttl_s=60)
    await second.release_lease("cp-2")  # not its lease: no effect
    assert await first.try_acquire_lease("cp-1", ttl_s=60)
    await first.release_lease("cp-1")

    assert await second.try_acquire_lease("cp-2", ttl_s=0.1)
    assert not await first.try_acquire_lease("cp-1", ttl_s=60)
    # cp-2 stops renewing (as a crashed replica would); its lease lapses on the server clock.
    await asyncio.sleep(0.4)
    assert await first.try_acquire_lease("cp-1", ttl_s=60)
    assert not await second.try_acquire_lease("cp-2", ttl_s=60)


async def test_events_published_by_one_replica_reach_the_other(replicas: Replicas):
    acting, other = replicas.open(timeout_s=10.0), replicas.open(timeout_s=10.0)
    events = acting.subscribe_placements()
    requests = acting.subscribe_activation_requests()
    try:
        assert await next_of(events) == RESYNC
        await other.request_activation("first")
        assert await next_of(requests) == "first"  # the subscription is in place now

        p = placement("mlp", "w7")
        await other.add_placement(p)
        assert await next_of(events) == added(p)
        await other.remove_worker("w7")
        assert await next_of(events) == PlacementEvent(PlacementEventKind.REMOVED, p)
        await other.request_activation("second")
        assert await next_of(requests) == "second"
        assert await acting.list_placements() == []
    finally:
        await events.aclose()
        await requests.aclose()
