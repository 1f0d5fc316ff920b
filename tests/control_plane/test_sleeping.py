"""Sleeping replicas: the reaper puts an idle LLM to sleep after ``sleep_after_s`` and
unloads it after ``idle_timeout_s``; an activation wakes it (timeline phase ``wake``); a
sleeping replica holds its worker's room and is the first evicted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from control_plane.activation import Orchestrator
from control_plane.api import schemas
from control_plane.api.service import AdminService
from control_plane.backends.base import PoolSpec
from control_plane.metrics import ControlPlaneMetrics
from control_plane.placement import Placer
from control_plane.store.memory import MemoryStateStore
from foundation.records import ModelRecord, ResourceSpec, ScalingSpec
from tests.control_plane.fakes import FakeBackend, FakeWorkers, make_settings
from tests.control_plane.test_reaper import IDLE_S, Setup

pytestmark = pytest.mark.anyio

SLEEP_S = 10.0


class SleepSetup(Setup):
    def __init__(self, **overrides: Any) -> None:
        super().__init__(**overrides)
        self.orchestrator = Orchestrator(
            self.store,
            self.placer,
            self.settings,
            ControlPlaneMetrics(CollectorRegistry()),
            self.acting,
            wall=self.wall,
        )

    async def __aenter__(self) -> SleepSetup:
        await super().__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.orchestrator.close()
        await super().__aexit__(*exc)

    async def place_llm(self, name: str = "llm", *, memory_bytes: int = 0) -> None:
        record = ModelRecord(
            name=name,
            storage_uri=f"/models/{name}",
            backend="transformers",
            scaling=ScalingSpec(idle_timeout_s=IDLE_S, sleep_after_s=SLEEP_S),
            resources=ResourceSpec(memory_bytes=memory_bytes),
        )
        await self.store.create_model(record)
        await self.placer.place(record)
        await self.traffic(name, 0)

    async def asleep(self) -> set[tuple[str, str]]:
        return {(p.model, p.worker_id) for p in await self.store.list_sleeping()}


async def test_idle_llm_sleeps_then_a_request_wakes_it_with_a_wake_phase():
    async with SleepSetup() as s:
        await s.place_llm()
        s.wall.advance(SLEEP_S - 1)
        await s.sweep()
        assert await s.placed() == {"llm"}
        s.wall.advance(2)
        await s.sweep()
        assert await s.placed() == set()
        assert await s.asleep() == {("llm", "w1")}
        assert s.workers.events[-1] == ("sleep", "w1", "llm")
        assert s.workers.unloads() == []
        await s.sweep()  # a sleeping replica is not put to sleep again
        assert [e for e in s.workers.events if e[0] == "sleep"] == [("sleep", "w1", "llm")]

        placement = await s.orchestrator.activate("llm")
        assert placement.worker_id == "w1"
        assert await s.asleep() == set()
        assert s.workers.events[-1] == ("wake", "w1", "llm")
        assert s.workers.loads() == [("w1", "llm")]  # the first load only
        [timeline, *_] = await s.store.list_activations("llm")
        assert timeline["outcome"] == "woken"
        assert [p["phase"] for p in timeline["phases"]] == [
            "queued",
            "worker_ready",
            "wake",
            "ready",
        ]
        assert "wake" in timeline["durations_s"] and "load" not in timeline["durations_s"]


async def test_a_sleeping_llm_unloads_after_its_idle_timeout():
    async with SleepSetup() as s:
        await s.place_llm()
        s.wall.advance(SLEEP_S + 1)
        await s.sweep()
        assert await s.asleep() == {("llm", "w1")}
        s.wall.advance(IDLE_S - SLEEP_S - 2)
        await s.sweep()
        assert await s.asleep() == {("llm", "w1")}
        assert s.backend.stopped == []  # a worker holding a sleeper is not idle
        s.wall.advance(2)
        await s.sweep()
        assert await s.asleep() == set()
        assert s.workers.unloads() == [("w1", "llm")]


async def test_a_model_that_cannot_sleep_is_unloaded_instead():
    async with SleepSetup() as s:
        s.workers.cannot_sleep.add("llm")
        await s.place_llm()
        s.wall.advance(SLEEP_S + 1)
        await s.sweep()
        assert await s.placed() == set()
        assert await s.asleep() == set()
        assert s.workers.unloads() == [("w1", "llm")]


async def test_a_failed_wake_unloads_the_sleeper_and_loads_anew():
    async with SleepSetup() as s:
        await s.place_llm()
        s.wall.advance(SLEEP_S + 1)
        await s.sweep()
        s.workers.fail_wakes.add("w1")
        await s.orchestrator.activate("llm")
        assert ("unload", "w1", "llm") in s.workers.events
        assert s.workers.loads() == [("w1", "llm"), ("w1", "llm")]
        assert await s.placed() == {"llm"}
        assert await s.asleep() == set()


async def test_a_wake_and_an_unload_never_both_go_ahead():
    async with SleepSetup() as s:
        await s.place_llm()
        s.wall.advance(SLEEP_S + 1)
        await s.sweep()
        record = await s.store.get_model("llm")
        assert record is not None
        results = await asyncio.gather(
            s.placer.place(record), s.placer.unload_sleeping("llm", "w1")
        )
        woken_or_loaded = results[0]
        assert woken_or_loaded.placement.worker_id == "w1"
        kinds = [k for k, _, _ in s.workers.events[1:]]
        # Either the wake won (no unload), or the unload won and a fresh load followed.
        assert kinds in (["sleep", "wake"], ["sleep", "unload", "load"])


async def test_a_sleeping_replica_holds_room_and_is_evicted_first():
    store, backend, workers = MemoryStateStore(), FakeBackend(), FakeWorkers()
    pool = PoolSpec(name="default", max_workers=1, memory_bytes=100)
    await backend.ensure_pool(pool)
    placer = Placer(store, backend, pool, workers, make_settings())
    try:
        llm = ModelRecord(
            name="llm", storage_uri="/models/llm", resources=ResourceSpec(memory_bytes=60)
        )
        other = ModelRecord(
            name="other", storage_uri="/models/other", resources=ResourceSpec(memory_bytes=60)
        )
        await store.create_model(llm)
        await store.create_model(other)
        await placer.place(llm)
        await placer.sleep("llm", "w1")
        assert [(p.model, p.worker_id) for p in await store.list_sleeping()] == [("llm", "w1")]
        assert not placer.is_idle("w1", await store.list_sleeping())
        result = await placer.place(other)
        assert result.evicted == ("llm",)
        assert await store.list_sleeping() == []
        assert workers.events == [
            ("load", "w1", "llm"),
            ("sleep", "w1", "llm"),
            ("unload", "w1", "llm"),
            ("load", "w1", "other"),
        ]
    finally:
        await placer.close()
        await store.close()


async def test_admin_unload_and_delete_unload_sleepers_too():
    async with SleepSetup() as s:
        admin = AdminService(s.store, s.orchestrator, s.placer, s.backend, s.acting)
        await s.place_llm()
        s.wall.advance(SLEEP_S + 1)
        await s.sweep()
        assert (await admin.get("llm")).status.state == "sleeping"
        assert [r.worker_id for r in (await admin.get("llm")).status.sleeping] == ["w1"]
        await admin.unload("llm")
        assert s.workers.unloads() == [("w1", "llm")]
        assert (await admin.get("llm")).status.state == "scaled_to_zero"

        await s.orchestrator.activate("llm")
        s.wall.advance(SLEEP_S + 1)
        await s.sweep()
        await admin.delete("llm")
        assert s.workers.unloads() == [("w1", "llm"), ("w1", "llm")]
        assert await s.asleep() == set()


@pytest.mark.parametrize(
    ("scaling", "is_valid"),
    [
        pytest.param({"idle_timeout_s": 60, "sleep_after_s": 10}, True, id="below"),
        pytest.param({"idle_timeout_s": 60, "sleep_after_s": 0}, True, id="never"),
        pytest.param({"idle_timeout_s": 60, "sleep_after_s": 60}, False, id="equal"),
        pytest.param({"idle_timeout_s": 60, "sleep_after_s": -1}, False, id="negative"),
    ],
)
def test_sleep_after_must_come_before_the_idle_timeout(
    scaling: dict[str, float], is_valid: bool
) -> None:
    if is_valid:
        assert schemas.ScalingSpec.model_validate(scaling).sleep_after_s == scaling["sleep_after_s"]
    else:
        with pytest.raises(ValidationError):
            schemas.ScalingSpec.model_validate(scaling)
