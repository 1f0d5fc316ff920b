"""The placer: where replicas go, what gets evicted, and the order replicas are retired in."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from control_plane.backends.base import PoolSpec
from control_plane.errors import LoadFailedError, NoCapacityError
from control_plane.placement import Placer
from control_plane.store.memory import MemoryStateStore
from foundation.records import ModelRecord, ResourceSpec, ScalingSpec, TrafficReport
from tests.control_plane.fakes import FakeBackend, FakeWorkers, make_settings

pytestmark = pytest.mark.anyio


class Setup:
    def __init__(self, **overrides: Any) -> None:
        pool_overrides = {k: overrides.pop(k) for k in ("device", "memory_bytes") if k in overrides}
        self.settings = make_settings(**overrides)
        self.store = MemoryStateStore()
        self.backend = FakeBackend()
        self.workers = FakeWorkers()
        self.pool = PoolSpec(
            name=self.settings.pool,
            device=pool_overrides.get("device", "cpu"),
            memory_bytes=pool_overrides.get("memory_bytes", 0),
            max_workers=self.settings.max_workers,
        )
        self.placer = Placer(self.store, self.backend, self.pool, self.workers, self.settings)

    async def __aenter__(self) -> Setup:
        await self.backend.ensure_pool(self.pool)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.placer.close()
        await self.store.close()

    async def register(self, name: str, **kwargs: Any) -> ModelRecord:
        record = ModelRecord(name=name, storage_uri=f"/models/{name}", **kwargs)
        await self.store.create_model(record)
        return record

    async def busy(self, model: str, in_flight: int) -> None:
        now = time.time()
        await self.store.report_traffic(TrafficReport(model, "a1", in_flight, now, now))


async def test_first_placement_starts_a_worker_and_publishes():
    async with Setup() as s:
        model = await s.register("m")
        result = await s.placer.place(model)
        assert result.is_worker_started
        assert not result.is_revived
        assert s.backend.started == ["w1"]
        assert s.workers.loads() == [("w1", "m")]
        placements = await s.store.list_placements("m")
        assert [(p.worker_id, p.url, p.generation) for p in placements] == [
            ("w1", "http://worker-1", 1)
        ]
        assert [w.id for w in await s.store.list_workers()] == ["w1"]
        assert result.load is not None and result.load.cache == "hit"
        assert result.worker_ready_at <= result.loaded_at


async def test_models_pack_onto_a_worker_with_room():
    async with Setup() as s:
        await s.placer.place(await s.register("a"))
        result = await s.placer.place(await s.register("b"))
        assert not result.is_worker_started
        assert s.backend.started == ["w1"]
        assert s.workers.loads() == [("w1", "a"), ("w1", "b")]


async def test_a_second_replica_goes_to_another_worker():
    async with Setup() as s:
        model = await s.register("m", scaling=ScalingSpec(max_replicas=2))
        await s.placer.place(model)
        await s.placer.place(model)
        assert sorted(p.worker_id for p in await s.store.list_placements("m")) == ["w1", "w2"]


async def test_memory_budget_sends_a_model_to_a_new_worker():
    async with Setup(memory_bytes=100) as s:
        await s.placer.place(await s.register("a", resources=ResourceSpec(memory_bytes=60)))
        result = await s.placer.place(
            await s.register("b", resources=ResourceSpec(memory_bytes=60))
        )
        assert result.worker.id == "w2"
        assert result.is_worker_started


async def test_a_model_larger_than_any_worker_is_refused():
    async with Setup(memory_bytes=100) as s:
        with pytest.raises(NoCapacityError, match="needs 101 bytes"):
            await s.placer.place(await s.register("big", resources=ResourceSpec(memory_bytes=101)))
        assert s.backend.started == []


async def test_models_per_worker_bound():
    async with Setup(max_models_per_worker=1) as s:
        await s.placer.place(await s.register("a"))
        result = await s.placer.place(await s.register("b"))
        assert result.worker.id == "w2"


async def test_full_pool_evicts_the_least_recently_used_idle_replica():
    async with Setup(max_workers=1, max_models_per_worker=2) as s:
        await s.placer.place(await s.register("old"))
        await s.placer.place(await s.register("recent"))
        now = time.time()
        await s.store.report_traffic(TrafficReport("old", "a1", 0, now - 100, now))
        await s.store.report_traffic(TrafficReport("recent", "a1", 0, now - 1, now))
        result = await s.placer.place(await s.register("new"))
        assert result.evicted == ("old",)
        assert result.worker.id == "w1"
        assert {p.model for p in await s.store.list_placements()} == {"recent", "new"}
        # The victim is unloaded before the new model loads.
        assert s.workers.events[-2:] == [("unload", "w1", "old"), ("load", "w1", "new")]


async def test_a_prewarm_takes_free_room_only_and_evicts_nothing():
    async with Setup(max_workers=1, max_models_per_worker=2) as s:
        await s.placer.place(await s.register("old"))
        await s.placer.place(await s.register("recent"))
        now = time.time()
        await s.store.report_traffic(TrafficReport("old", "a1", 0, now - 100, now))
        await s.store.report_traffic(TrafficReport("recent", "a1", 0, now - 1, now))
        new = await s.register("new")
        with pytest.raises(NoCapacityError, match="only by evicting 'old'"):
            await s.placer.place(new, may_evict=False)
        assert {p.model for p in await s.store.list_placements()} == {"old", "recent"}
        assert ("unload", "w1", "old") not in s.workers.events
        # The room it claimed is free again: an ordinary activation evicts as before.
        result = await s.placer.place(new)
        assert result.evicted == ("old",)


async def test_busy_and_pinned_replicas_are_not_evicted():
    async with Setup(max_workers=1, max_models_per_worker=2) as s:
        await s.placer.place(await s.register("busy"))
        await s.placer.place(await s.register("pinned", scaling=ScalingSpec(min_replicas=1)))
        await s.busy("busy", in_flight=3)
        with pytest.raises(NoCapacityError, match="no idle replica can be evicted"):
            await s.placer.place(await s.register("new"))
        assert s.workers.unloads() == []


async def test_prefers_the_worker_that_loaded_the_model_before():
    async with Setup(max_models_per_worker=1) as s:
        a = await s.register("a")
        b = await s.register("b")
        await s.placer.place(a)  # w1
        await s.placer.place(b)  # w2
        await s.placer.retire("a", "w1", reason="test")
        await s.placer.retire("b", "w2", reason="test")
        # Both workers are empty; b's caches are warm on w2, so it goes back there.
        result = await s.placer.place(b)
        assert result.worker.id == "w2"


async def test_concurrent_activations_wait_for_a_starting_worker():
    async with Setup(max_workers=1) as s:
        gate = s.backend.start_gate = asyncio.Event()
        a = asyncio.create_task(s.placer.place(await s.register("a")))
        b = asyncio.create_task(s.placer.place(await s.register("b")))
        await asyncio.sleep(0.05)
        gate.set()
        results = await asyncio.gather(a, b)
        assert {r.worker.id for r in results} == {"w1"}
        assert s.backend.started == ["w1"]


async def test_cuda_model_on_a_cpu_pool_is_refused():
    async with Setup() as s:
        model = await s.register("gpu", resources=ResourceSpec(device="cuda"))
        with pytest.raises(NoCapacityError, match="no cuda workers"):
            await s.placer.place(model)
        assert s.backend.started == []


async def test_cpu_model_may_use_a_cuda_worker():
    async with Setup(device="cuda") as s:
        result = await s.placer.place(await s.register("m"))
        assert result.worker.device == "cuda"


async def test_refused_load_publishes_nothing_and_frees_the_room():
    async with Setup(max_workers=1, max_models_per_worker=1) as s:
        s.workers.fail_loads["bad"] = "400: bad config"
        with pytest.raises(LoadFailedError, match="bad config"):
            await s.placer.place(await s.register("bad"))
        assert await s.store.list_placements() == []
        # The reservation is gone: the only slot takes the next model.
        result = await s.placer.place(await s.register("good"))
        assert result.worker.id == "w1"


async def test_worker_dying_during_the_load_is_retried_elsewhere():
    async with Setup() as s:
        await s.placer.place(await s.register("first"))
        s.workers.die_on_load.add("w1")
        s.backend.kill("w1")
        await s.placer.forget_worker("w1")
        result = await s.placer.place(await s.register("second"))
        assert result.worker.id == "w2"


async def test_retire_removes_the_placement_before_unloading():
    async with Setup(placement_propagation_s=0.05) as s:
        await s.placer.place(await s.register("m"))
        seen: list[object] = []

        async def watch() -> None:
            async for event in s.store.subscribe_placements():
                seen.append((event.kind.value, len(s.workers.unloads())))

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0)
        await s.placer.retire("m", "w1", reason="test")
        await asyncio.sleep(0)
        watcher.cancel()
        # REMOVED was published while no unload had happened yet.
        assert ("removed", 0) in seen
        assert s.workers.unloads() == [("w1", "m")]
        assert await s.store.list_placements() == []
        assert not s.placer.is_retiring("m")


async def test_retire_drains_in_flight_requests_first():
    async with Setup(drain_timeout_s=5.0) as s:
        await s.placer.place(await s.register("m"))
        await s.busy("m", in_flight=2)
        task = asyncio.create_task(s.placer.retire("m", "w1", reason="test"))
        await asyncio.sleep(0.3)
        assert s.workers.unloads() == []
        assert s.placer.is_retiring("m")
        await s.busy("m", in_flight=0)
        await asyncio.wait_for(task, 5)
        assert s.workers.unloads() == [("w1", "m")]


async def test_a_request_during_the_propagation_pause_revives_the_replica():
    async with Setup(placement_propagation_s=5.0) as s:
        model = await s.register("m")
        await s.placer.place(model)
        retiring = asyncio.create_task(s.placer.retire("m", "w1", reason="idle"))
        await asyncio.sleep(0.05)
        assert await s.store.list_placements("m") == []
        result = await s.placer.place(model)
        assert result.is_revived
        assert result.worker.id == "w1"
        await asyncio.wait_for(retiring, 5)
        assert s.workers.unloads() == []
        assert s.workers.loads() == [("w1", "m")]
        assert [p.worker_id for p in await s.store.list_placements("m")] == ["w1"]


async def test_a_placement_waits_for_an_unload_in_progress():
    async with Setup() as s:
        model = await s.register("m")
        await s.placer.place(model)
        await s.busy("m", in_flight=1)
        retiring = asyncio.create_task(s.placer.retire("m", "w1", reason="idle"))
        await asyncio.sleep(0.05)  # past the (zero) propagation pause: draining now
        placing = asyncio.create_task(s.placer.place(model))
        await asyncio.sleep(0.05)
        assert not placing.done()
        await s.busy("m", in_flight=0)
        result = await asyncio.wait_for(placing, 5)
        await retiring
        assert s.workers.events == [
            ("load", "w1", "m"),
            ("unload", "w1", "m"),
            ("load", "w1", "m"),
        ]
        assert result.worker.id == "w1"


async def test_stop_worker_if_idle():
    async with Setup() as s:
        await s.placer.place(await s.register("m"))
        assert not await s.placer.stop_worker_if_idle("w1")
        await s.placer.retire("m", "w1", reason="test")
        assert await s.placer.stop_worker_if_idle("w1")
        assert s.backend.stopped == ["w1"]
        assert await s.store.list_workers() == []


async def test_forget_worker_drops_its_placements():
    async with Setup() as s:
        await s.placer.place(await s.register("m"))
        s.backend.kill("w1")
        await s.placer.forget_worker("w1")
        assert await s.store.list_placements() == []
        assert await s.store.list_workers() == []


async def test_reload_loads_the_new_generation_in_place():
    async with Setup() as s:
        model = await s.register("m")
        await s.placer.place(model)
        updated = ModelRecord(name="m", storage_uri="/models/m2", generation=2)
        await s.placer.reload(updated)
        assert s.workers.loads() == [("w1", "m"), ("w1", "m")]
        assert [p.generation for p in await s.store.list_placements("m")] == [2]
