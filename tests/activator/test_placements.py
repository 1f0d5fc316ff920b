from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from activator.errors import CatalogUnavailableError
from activator.lb import Replica
from activator.placements import ModelCatalog, PlacementView, ReplicaTable
from foundation.records import Placement, PlacementEvent, PlacementEventKind
from tests.activator.fakes import FakeStore, RecordingListener, settle
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio


def _placement(model: str, worker: str, port: int = 9000) -> Placement:
    return Placement(model=model, worker_id=worker, url=f"http://127.0.0.1:{port}/")


class _View:
    """A running view over a fake store, with what its listener heard."""

    def __init__(self, store: FakeStore, *, quarantine_s: float = 3600.0) -> None:
        self.store = store
        self.table = ReplicaTable()
        self.listener = RecordingListener()
        self.view = PlacementView(
            store,
            self.table,
            self.listener,
            quarantine_s=quarantine_s,
            resubscribe_delay_s=0,
        )
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _View:
        self.task = asyncio.create_task(self.view.run())
        assert await self.view.wait_synced(5.0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.view.close()

    def workers(self, model: str) -> list[str]:
        return [r.worker_id for r in self.table.replicas(model)]


def test_table_chooses_least_outstanding_and_rotates_ties() -> None:
    table = ReplicaTable()
    assert table.choose("m") is None
    a, b = Replica("a", "http://a"), Replica("b", "http://b")
    table.add("m", a)
    table.add("m", b)
    picks = {table.choose("m") for _ in range(4)}
    assert picks == {a, b}
    a.in_flight = 3
    assert table.choose("m") is b
    assert table.get("m", "b") is b
    assert table.get("m", "c") is None
    assert table.remove("m", a)
    assert not table.remove("m", a)
    assert not table.remove("other", a)
    assert table.remove("m", b)
    assert table.models() == []
    assert table.replicas("m") == ()


async def test_resync_loads_existing_placements() -> None:
    store = FakeStore()
    await store.add_placement(_placement("m", "w1"))
    async with _View(store) as v:
        assert v.view.is_synced
        assert v.workers("m") == ["w1"]
        assert v.table.replicas("m")[0].url == "http://127.0.0.1:9000"
        assert v.listener.events == [("added", "m", "w1")]


async def test_added_and_removed_events_follow_the_store() -> None:
    store = FakeStore()
    async with _View(store) as v:
        await store.add_placement(_placement("m", "w1"))
        await store.add_placement(_placement("m", "w2", 9001))
        await settle()
        assert v.workers("m") == ["w1", "w2"]
        await store.remove_placement("m", "w1")
        await settle()
        assert v.workers("m") == ["w2"]
        # A repeated announcement changes nothing; a new URL replaces the replica.
        await store.add_placement(_placement("m", "w2", 9001))
        await settle()
        assert v.listener.events == [
            ("added", "m", "w1"),
            ("added", "m", "w2"),
            ("removed", "m", "w1"),
        ]
        await store.add_placement(_placement("m", "w2", 9002))
        await settle()
        assert v.table.replicas("m")[0].url == "http://127.0.0.1:9002"
        assert v.listener.events[-2:] == [("removed", "m", "w2"), ("added", "m", "w2")]
        # Removing what is not there is a no-op.
        v.store.publish(PlacementEvent(PlacementEventKind.REMOVED, _placement("m", "gone")))
        await settle()
        assert v.workers("m") == ["w2"]


async def test_a_resync_reconciles_missed_events() -> None:
    store = FakeStore()
    await store.add_placement(_placement("m", "w1"))
    await store.add_placement(_placement("m", "w2", 9001))
    async with _View(store) as v:
        # Changes the view never heard of, then a RESYNC (as after a reconnect).
        del store.placements["m", "w1"]
        store.placements["n", "w3"] = _placement("n", "w3", 9003)
        store.publish(PlacementEvent(PlacementEventKind.RESYNC))
        await settle()
        assert v.workers("m") == ["w2"]
        assert v.workers("n") == ["w3"]


async def test_an_event_without_placement_is_ignored() -> None:
    store = FakeStore()
    async with _View(store) as v:
        store.publish(PlacementEvent(PlacementEventKind.ADDED))
        await store.add_placement(_placement("m", "w1"))
        await settle()
        assert v.workers("m") == ["w1"]


async def test_a_failed_subscription_is_renewed() -> None:
    store = FakeStore()
    async with _View(store) as v:
        store.publish(ConnectionError("store went away"))
        await settle()
        assert store.subscriber_count == 1
        await store.add_placement(_placement("m", "w1"))
        await settle()
        assert v.workers("m") == ["w1"]


async def test_an_ended_subscription_is_renewed() -> None:
    class _Ending(FakeStore):
        subscriptions = 0

        async def subscribe_placements(self) -> AsyncIterator[PlacementEvent]:
            self.subscriptions += 1
            if self.subscriptions == 1:
                yield PlacementEvent(PlacementEventKind.RESYNC)
                return
            async for event in super().subscribe_placements():
                yield event

    store = _Ending()
    async with _View(store) as v:
        await settle()
        assert store.subscriptions == 2
        await store.add_placement(_placement("m", "w1"))
        await settle()
        assert v.workers("m") == ["w1"]


async def test_wait_synced_gives_up_after_its_timeout() -> None:
    view = PlacementView(
        FakeStore(), ReplicaTable(), RecordingListener(), quarantine_s=1, resubscribe_delay_s=1
    )
    assert not await view.wait_synced(0)
    assert not view.is_synced


async def test_a_forgotten_replica_returns_after_quarantine() -> None:
    store = FakeStore()
    await store.add_placement(_placement("m", "w1"))
    async with _View(store, quarantine_s=0) as v:
        replica = v.table.replicas("m")[0]
        v.view.forget("m", replica)
        assert v.workers("m") == []
        v.view.forget("m", replica)  # twice: already gone
        await settle()
        assert v.workers("m") == ["w1"]
        assert v.table.replicas("m")[0] is not replica
        assert v.listener.events == [
            ("added", "m", "w1"),
            ("removed", "m", "w1"),
            ("added", "m", "w1"),
        ]


async def test_a_store_removal_ends_the_quarantine_for_good() -> None:
    store = FakeStore()
    await store.add_placement(_placement("m", "w1"))
    async with _View(store) as v:
        v.view.forget("m", v.table.replicas("m")[0])
        await store.remove_placement("m", "w1")
        await settle()
        assert v.workers("m") == []
        assert v.listener.events[-1] == ("removed", "m", "w1")


async def test_a_store_announcement_ends_the_quarantine_early() -> None:
    store = FakeStore()
    await store.add_placement(_placement("m", "w1"))
    async with _View(store) as v:
        v.view.forget("m", v.table.replicas("m")[0])
        await store.add_placement(_placement("m", "w1"))
        await settle()
        assert v.workers("m") == ["w1"]


async def test_a_resync_keeps_quarantined_replicas_out_and_drops_removed_ones() -> None:
    store = FakeStore()
    await store.add_placement(_placement("m", "w1"))
    await store.add_placement(_placement("m", "w2", 9001))
    async with _View(store) as v:
        for replica in list(v.table.replicas("m")):
            v.view.forget("m", replica)
        del store.placements["m", "w2"]
        store.publish(PlacementEvent(PlacementEventKind.RESYNC))
        await settle()
        assert v.workers("m") == []
    # w1 stays quarantined through the resync; w2 is dropped (the store removed it).


async def test_close_cancels_returns_from_quarantine() -> None:
    store = FakeStore()
    await store.add_placement(_placement("m", "w1"))
    async with _View(store, quarantine_s=0) as v:
        v.view.forget("m", v.table.replicas("m")[0])
        v.view.close()  # cancels the return
        await settle()
        assert v.workers("m") == []


async def test_a_suspended_worker_leaves_routing_for_every_model_until_resumed() -> None:
    store = FakeStore()
    await store.add_placement(_placement("a", "w1"))
    await store.add_placement(_placement("b", "w1"))
    await store.add_placement(_placement("a", "w2", 9001))
    async with _View(store) as v:
        assert v.view.suspend("w1") == ["a", "b"]
        assert v.view.suspend("w1") == []  # already out
        assert v.view.suspend("w3") == []  # nothing there to take out
        assert v.workers("a") == ["w2"]
        assert v.workers("b") == []
        assert v.view.suspended() == {"w1": "http://127.0.0.1:9000"}
        assert ("removed", "a", "w1") in v.listener.events
        assert ("removed", "b", "w1") in v.listener.events
        v.view.resume("w1")
        v.view.resume("w1")  # twice: nothing more
        assert sorted(v.workers("a")) == ["w1", "w2"]
        assert v.workers("b") == ["w1"]
        assert v.view.suspended() == {}


async def test_the_store_cannot_put_a_suspended_worker_back() -> None:
    store = FakeStore()
    await store.add_placement(_placement("a", "w1"))
    async with _View(store) as v:
        v.view.suspend("w1")
        # Announced again (a new model, a resync): kept aside, not routed.
        await store.add_placement(_placement("c", "w1"))
        store.publish(PlacementEvent(PlacementEventKind.RESYNC))
        await settle()
        assert v.workers("a") == []
        assert v.workers("c") == []
        v.view.resume("w1")
        assert v.workers("a") == ["w1"]
        assert v.workers("c") == ["w1"]


async def test_placements_removed_while_suspended_do_not_come_back() -> None:
    store = FakeStore()
    await store.add_placement(_placement("a", "w1"))
    await store.add_placement(_placement("b", "w1"))
    async with _View(store) as v:
        v.view.suspend("w1")
        await store.remove_placement("a", "w1")
        await settle()
        assert v.view.suspended() == {"w1": "http://127.0.0.1:9000"}
        del store.placements["b", "w1"]
        store.publish(PlacementEvent(PlacementEventKind.RESYNC))
        await settle()
        # Nothing left there: the worker is no longer suspended (nor watched).
        assert v.view.suspended() == {}
        v.view.resume("w1")
        assert v.table.models() == []


async def test_a_quarantine_ending_on_a_suspended_worker_keeps_it_out() -> None:
    store = FakeStore()
    await store.add_placement(_placement("a", "w1"))
    await store.add_placement(_placement("b", "w1"))
    async with _View(store, quarantine_s=0) as v:
        v.view.forget("a", v.table.replicas("a")[0])
        assert v.view.suspend("w1") == ["b"]
        await settle()  # the quarantine of a ends
        assert v.table.models() == []
        v.view.resume("w1")
        assert sorted(v.table.models()) == ["a", "b"]


# ---- ModelCatalog ----


def _catalog(store: FakeStore, clock: FakeClock, *, max_entries: int = 100) -> ModelCatalog:
    return ModelCatalog(store, ttl_s=2.0, max_entries=max_entries, retry_after_s=4, clock=clock)


async def test_catalog_caches_known_and_unknown_names_for_the_ttl() -> None:
    store, clock = FakeStore(), FakeClock()
    store.register("m")
    catalog = _catalog(store, clock)
    assert catalog.cached("m") is None
    assert await catalog.is_registered("m")
    assert not await catalog.is_registered("nope")
    assert catalog.cached("m") is True
    assert catalog.cached("nope") is False
    assert await catalog.is_registered("m")
    assert store.get_model_calls == ["m", "nope"]
    clock.advance(2.0)
    assert catalog.cached("m") is None
    del store.models["m"]
    assert not await catalog.is_registered("m")
    assert store.get_model_calls == ["m", "nope", "m"]


async def test_catalog_serves_a_stale_answer_when_the_store_fails() -> None:
    store, clock = FakeStore(), FakeClock()
    store.register("m")
    catalog = _catalog(store, clock)
    assert await catalog.is_registered("m")
    clock.advance(10)
    store.get_model_error = ConnectionError("down")
    assert await catalog.is_registered("m")


async def test_catalog_without_an_answer_raises_store_unavailable() -> None:
    store = FakeStore()
    store.get_model_error = ConnectionError("down")
    catalog = _catalog(store, FakeClock())
    with pytest.raises(CatalogUnavailableError) as caught:
        await catalog.is_registered("m")
    assert caught.value.retry_after_s == 4
    assert "state store unavailable (ConnectionError)" in caught.value.message


async def test_catalog_is_bounded() -> None:
    store = FakeStore()
    catalog = _catalog(store, FakeClock(), max_entries=2)
    for name in ("a", "b", "c"):
        await catalog.is_registered(name)
    assert catalog.cached("a") is None
    assert catalog.cached("c") is False
    await catalog.is_registered("c")  # refreshing a present name does not clear
    assert catalog.cached("c") is False


async def test_catalog_lists_models_and_remembers_them() -> None:
    store = FakeStore()
    store.register("a")
    store.register("b")
    catalog = _catalog(store, FakeClock())
    assert [r.name for r in await catalog.list_models()] == ["a", "b"]
    assert catalog.cached("a") is True
    assert store.get_model_calls == []
