"""What only the in-memory store promises: its bounded per-subscriber queues, and expiry on an
injected clock (the contract suite checks expiry against real time for both stores)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

import pytest

from control_plane.store.memory import MemoryStateStore
from foundation.records import (
    FirstResponse,
    Placement,
    PlacementEvent,
    PlacementEventKind,
    TrafficReport,
)
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio

T = TypeVar("T")

RESYNC = PlacementEvent(PlacementEventKind.RESYNC)


async def next_of(events: AsyncIterator[T]) -> T:
    async with asyncio.timeout(10.0):
        return await anext(events)


def placement(model: str, worker_id: str = "w1") -> Placement:
    return Placement(model=model, worker_id=worker_id, url=f"http://{worker_id}:8000")


async def test_a_subscriber_that_falls_behind_gets_resync_instead_of_a_gap():
    store = MemoryStateStore(subscriber_queue_max=2)
    slow, fast = store.subscribe_placements(), store.subscribe_placements()
    try:
        assert await next_of(slow) == RESYNC
        assert await next_of(fast) == RESYNC
        for n in range(5):
            await store.add_placement(placement(f"m{n}"))
            # The fast subscriber keeps up and sees every event.
            assert await next_of(fast) == PlacementEvent(
                PlacementEventKind.ADDED, placement(f"m{n}")
            )
        # The slow one's queue overflowed: it is told to re-read, and the state is all there.
        assert await next_of(slow) == RESYNC
        assert [p.model for p in await store.list_placements()] == [f"m{n}" for n in range(5)]
        await store.add_placement(placement("later"))
        assert await next_of(slow) == PlacementEvent(PlacementEventKind.ADDED, placement("later"))
    finally:
        await slow.aclose()
        await fast.aclose()
        await store.close()


async def test_an_activation_subscriber_that_falls_behind_gets_every_pending_request():
    store = MemoryStateStore(subscriber_queue_max=2)
    await store.request_activation("m0")
    requests = store.subscribe_activation_requests()
    try:
        assert await next_of(requests) == "m0"
        for n in range(1, 6):
            await store.request_activation(f"m{n}")
        # Overflowed: the queued names were replaced by a replay of all that is pending.
        assert [await next_of(requests) for _ in range(6)] == [f"m{n}" for n in range(6)]
        await store.request_activation("m6")
        assert await next_of(requests) == "m6"
    finally:
        await requests.aclose()
        await store.close()


async def test_a_first_response_subscriber_that_falls_behind_gets_every_kept_report():
    clock = FakeClock()
    store = MemoryStateStore(subscriber_queue_max=2, clock=clock)
    reports = [
        FirstResponse(f"m{n}", "a1", "w1", responded_at=float(n), waited_s=1.0) for n in range(7)
    ]
    await store.report_first_response(reports[0])
    subscription = store.subscribe_first_responses()
    try:
        assert await next_of(subscription) == reports[0]
        for n in range(1, 6):
            clock.now += 1.0  # kept longer than the ones before: replayed after them
            await store.report_first_response(reports[n])
        # Overflowed: the queued reports were replaced by a replay of all that are kept.
        assert [await next_of(subscription) for _ in range(6)] == reports[:6]
        await store.report_first_response(reports[6])
        assert await next_of(subscription) == reports[6]
    finally:
        await subscription.aclose()
        await store.close()


async def test_expiry_follows_the_injected_clock():
    clock = FakeClock()
    store = MemoryStateStore(traffic_ttl_s=10.0, activation_pending_ttl_s=5.0, clock=clock)
    report = TrafficReport("mlp", "a1", in_flight=1, last_request_at=1.0, reported_at=2.0)
    await store.report_traffic(report)
    assert await store.try_acquire_lease("cp-1", ttl_s=3.0)
    await store.request_activation("mlp")
    requests = store.subscribe_activation_requests()
    try:
        assert await next_of(requests) == "mlp"

        clock.now += 2.999
        assert not await store.try_acquire_lease("cp-2", ttl_s=3.0)
        clock.now += 0.001  # the lease lapses exactly at its ttl
        assert await store.try_acquire_lease("cp-2", ttl_s=3.0)

        await store.request_activation("mlp")  # 3 s in: still pending, not published
        clock.now += 2.0
        await store.request_activation("mlp")  # 5 s in: lapsed, published again
        assert await next_of(requests) == "mlp"

        assert await store.traffic("mlp") == [report]
        clock.now += 5.0
        assert await store.traffic("mlp") == []
    finally:
        await requests.aclose()
        await store.close()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        pytest.param("subscriber_queue_max", 0, id="queue"),
        pytest.param("traffic_ttl_s", 0.0, id="traffic-ttl"),
        pytest.param("activation_pending_ttl_s", -1.0, id="pending-ttl"),
    ],
)
def test_bounds_are_checked(option: str, value: float):
    with pytest.raises(ValueError, match=option):
        MemoryStateStore(**{option: value})  # type: ignore[arg-type]
