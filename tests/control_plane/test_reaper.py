"""The reaper: idle models go to zero, idle workers go away, warm workers stay."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from control_plane import usage
from control_plane.keepalive import AdaptivePolicy
from control_plane.keepalive.tracker import STATE_KEY, IdleTracker
from control_plane.metrics import ControlPlaneMetrics
from control_plane.placement import PoolPlacers
from control_plane.reaper import PoolState, Reaper, WorkerDecision, decide_workers
from control_plane.settings import PoolSettings
from control_plane.store.memory import MemoryStateStore
from foundation.records import (
    ModelRecord,
    Placement,
    ScalingSpec,
    TrafficReport,
    WorkerRecord,
    WorkerState,
)
from tests.control_plane.fakes import Acting, FakeBackend, FakeWorkers, make_settings
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio

IDLE_S = 30.0
REPORT_TTL_S = 5.0


class NoActivations:
    def __init__(self) -> None:
        self.models: set[str] = set()
        self.requested: list[tuple[str, str]] = []

    def is_activating(self, model: str) -> bool:
        return model in self.models

    def request(self, model: str, *, trigger: str = "request") -> None:
        self.requested.append((model, trigger))


class Liveness:
    def __init__(self) -> None:
        self.live: set[str] = set()

    async def is_live(self, url: str) -> bool:
        return url in self.live


class Setup:
    def __init__(self, **overrides: Any) -> None:
        self.settings = make_settings(**overrides)
        self.wall = FakeClock(1_000_000.0)
        self.mono = FakeClock(500.0)
        self.store = MemoryStateStore(traffic_ttl_s=REPORT_TTL_S, clock=self.mono)
        self.backend = FakeBackend()
        self.workers = FakeWorkers()
        self.placer = PoolPlacers(
            self.store, self.backend, self.workers, self.settings, wall=self.wall
        )
        self.activations = NoActivations()
        self.liveness = Liveness()
        self.acting = Acting()
        self.reaper = self.new_reaper()

    def new_reaper(self) -> Reaper:
        """A reaper on this setup's store (a second one stands for a restart or failover),
        counting into a registry of its own (``self.registry``)."""
        self.registry = CollectorRegistry()
        return Reaper(
            self.store,
            self.placer,
            self.backend,
            self.activations,
            self.liveness,
            self.settings,
            ControlPlaneMetrics(self.registry),
            self.acting,
            clock=self.mono,
            wall=self.wall,
        )

    async def __aenter__(self) -> Setup:
        await self.placer.ensure_pools()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.reaper.close()
        await self.placer.close()
        await self.store.close()

    async def place(self, name: str, *, backend: str = "", **scaling: Any) -> None:
        record = ModelRecord(
            name=name,
            storage_uri=f"/models/{name}",
            backend=backend,
            scaling=ScalingSpec(idle_timeout_s=IDLE_S, **scaling),
        )
        await self.store.create_model(record)
        await self.placer.place(record)

    async def traffic(self, model: str, in_flight: int, *, ago_s: float = 0.0) -> None:
        at = self.wall.now - ago_s
        await self.store.report_traffic(TrafficReport(model, "a1", in_flight, at, self.wall.now))

    async def sweep(self) -> None:
        await self.reaper.sweep()
        await self.reaper.settle()

    async def placed(self) -> set[str]:
        return {p.model for p in await self.store.list_placements()}


async def test_idle_model_is_unloaded_after_its_timeout_not_before():
    async with Setup() as s:
        await s.place("m")
        await s.traffic("m", 0)
        s.wall.advance(IDLE_S - 1)
        await s.sweep()
        assert await s.placed() == {"m"}
        s.wall.advance(2)
        await s.sweep()
        assert await s.placed() == set()
        assert s.workers.unloads() == [("w1", "m")]


async def test_in_flight_requests_keep_a_model():
    async with Setup() as s:
        await s.place("m")
        await s.traffic("m", 1, ago_s=10 * IDLE_S)
        s.wall.advance(10 * IDLE_S)
        await s.sweep()
        assert await s.placed() == {"m"}


async def test_activity_is_remembered_after_reports_lapse():
    async with Setup() as s:
        await s.place("m")
        s.wall.advance(IDLE_S)
        await s.traffic("m", 1)
        await s.sweep()
        s.mono.advance(REPORT_TTL_S + 1)  # the report expires from the store
        assert await s.store.traffic("m") == []
        s.wall.advance(IDLE_S / 2)
        await s.sweep()
        # Idle since the last request seen, not since the (older) placement.
        assert await s.placed() == {"m"}
        s.wall.advance(IDLE_S / 2 + 1)
        await s.sweep()
        assert await s.placed() == set()


async def test_min_replicas_keep_a_model():
    async with Setup() as s:
        await s.place("m", min_replicas=1, max_replicas=1)
        s.wall.advance(10 * IDLE_S)
        await s.sweep()
        assert await s.placed() == {"m"}


async def test_a_model_being_activated_is_left_alone():
    async with Setup() as s:
        await s.place("m")
        s.activations.models.add("m")
        s.wall.advance(10 * IDLE_S)
        await s.sweep()
        assert await s.placed() == {"m"}


async def test_replicas_of_deleted_models_are_retired():
    async with Setup() as s:
        await s.place("m")
        await s.store.delete_model("m")
        # delete_model drops placements itself; put one back as a leftover
        await s.store.add_placement(Placement(model="m", worker_id="w1", url="http://worker-1"))
        await s.sweep()
        assert await s.placed() == set()
        assert s.workers.unloads() == [("w1", "m")]


async def _adaptive(
    s: Setup, name: str, *, bound_s: float = 3600.0, backend: str = "", sleep_after_s: float = 0
) -> None:
    record = ModelRecord(
        name=name,
        storage_uri=f"/models/{name}",
        backend=backend,
        scaling=ScalingSpec(idle_timeout_s=bound_s, policy="adaptive", sleep_after_s=sleep_after_s),
    )
    await s.store.create_model(record)
    await s.placer.place(record)


async def test_adaptive_model_learns_its_idle_times_into_the_store():
    async with Setup() as s:
        await _adaptive(s, "m")
        await s.traffic("m", 0)
        await s.sweep()
        s.wall.advance(100.0)
        await s.traffic("m", 1)  # a request after 100 s idle
        await s.sweep()
        doc = await s.store.get_model_state("m", STATE_KEY)
        assert doc is not None
        tracker = IdleTracker.from_json(doc)
        assert tracker.history.gaps == pytest.approx(1.0)
        assert tracker.idle_since is None  # busy now
        assert await s.placed() == {"m"}


async def _periodic_history(s: Setup, name: str) -> None:
    """A model called every 10 minutes, for the past 2 days."""
    history = AdaptivePolicy().new_history()
    now = s.wall.now
    for i in range(288):
        at = now - (288 - i) * 600.0
        history = history.observe(595.0, ended_at=at, requests=1.0, now=at)
    await s.store.put_model_state(name, STATE_KEY, IdleTracker(history).to_json())


async def test_adaptive_engine_that_can_sleep_sleeps_where_the_plan_unloads():
    async with Setup() as s:
        await _adaptive(s, "llm", backend="transformers", sleep_after_s=1800.0)
        await _periodic_history(s, "llm")
        await s.traffic("llm", 0)
        await s.sweep()
        s.wall.advance(60.0)
        await s.sweep()
        assert await s.placed() == set()
        assert [p.model for p in await s.store.list_sleeping()] == ["llm"]


async def test_adaptive_model_unloads_early_and_is_prewarmed_on_its_period():
    async with Setup() as s:
        await _adaptive(s, "m")
        await _periodic_history(s, "m")
        await s.traffic("m", 0)
        await s.sweep()
        s.wall.advance(60.0)
        await s.sweep()
        # Far below idle_timeout_s (an hour): the plan unloads and will pre-warm.
        assert await s.placed() == set()
        assert s.activations.requested == []
        s.wall.advance(600.0 - 60.0 - 2 * s.settings.keepalive_default_load_s)
        await s.sweep()
        assert s.activations.requested == [("m", "prewarm")]
        await s.sweep()  # once per idle period
        assert s.activations.requested == [("m", "prewarm")]


async def test_usage_adds_up_to_the_time_each_replica_was_loaded():
    async with Setup() as s:
        placed_at = s.wall.now
        await s.place("m")
        # The activation that loaded it, as the orchestrator records it.
        await s.store.add_activation(
            "m",
            {
                "id": "a1",
                "trigger": "request",
                "outcome": "ready",
                "queued_at": placed_at - 4.0,
                "durations_s": {"load": 3.0, "total": 4.0},
            },
            keep=5,
        )
        await s.traffic("m", 1)
        await s.sweep()
        s.wall.advance(7.0)
        await s.traffic("m", 0)  # busy for those 7 s
        await s.sweep()
        s.wall.advance(IDLE_S / 2)
        await s.sweep()
        s.wall.advance(IDLE_S)  # idle past its timeout: this sweep retires it
        await s.sweep()
        assert await s.placed() == set()
        retired_at = s.wall.now
        await s.reaper.flush_usage(force=True)
        doc = await s.store.get_model_state("m", usage.STATE_KEY)
        assert doc is not None
        total = usage.totals(usage.UsageLedger.from_json(doc), start=0.0, end=retired_at + 1)
        assert total.serving_s + total.idle_s == pytest.approx(retired_at - placed_at)
        assert total.serving_s == pytest.approx(7.0)
        assert total.loading_s == pytest.approx(3.0)
        assert (total.activations, total.cold_starts) == (1, 1)
        assert total.cold_start_wait_s == pytest.approx(4.0)
        # Prometheus counts the same figures.
        for state, seconds in (
            ("serving", total.serving_s),
            ("idle", total.idle_s),
            ("loading", total.loading_s),
        ):
            counted = s.registry.get_sample_value(
                "zeroserve_model_replica_seconds_total", {"model": "m", "state": state}
            )
            assert counted == pytest.approx(seconds), state
        labels = {"model": "m"}
        assert s.registry.get_sample_value("zeroserve_model_cold_starts_total", labels) == 1.0
        wait = s.registry.get_sample_value("zeroserve_model_cold_start_wait_seconds_total", labels)
        assert wait == pytest.approx(4.0)


async def test_a_restarted_reaper_goes_on_from_what_the_store_kept():
    async with Setup() as s:
        placed_at = s.wall.now
        await _adaptive(s, "m")
        await s.traffic("m", 0)
        await s.sweep()
        s.wall.advance(100.0)
        await s.traffic("m", 1)  # a request after 100 s idle: one idle time learned
        await s.sweep()
        s.wall.advance(5.0)
        await s.traffic("m", 0)
        await s.sweep()
        await s.reaper.close()  # a restart, or another control plane taking over
        s.mono.advance(REPORT_TTL_S + 1)  # meanwhile the last reports expire
        assert await s.store.traffic("m") == []
        s.reaper = s.new_reaper()
        s.wall.advance(25.0)
        await s.sweep()
        s.wall.advance(25.0)
        await s.traffic("m", 1)  # the idle period that began before the restart ends
        await s.sweep()
        doc = await s.store.get_model_state("m", STATE_KEY)
        assert doc is not None
        history = IdleTracker.from_json(doc).history
        # Both idle times, the first decayed by the 55 s since (half-life a day).
        assert history.gaps == pytest.approx(2.0, rel=1e-3)
        assert history.counts[np.searchsorted(history.edges, 100.0) - 1] > 0.99
        await s.reaper.flush_usage(force=True)
        doc = await s.store.get_model_state("m", usage.STATE_KEY)
        assert doc is not None
        total = usage.totals(usage.UsageLedger.from_json(doc), start=0.0, end=s.wall.now + 1)
        # The new reaper goes on from the old one's ledger: nothing lost, nothing twice.
        assert total.serving_s + total.idle_s == pytest.approx(s.wall.now - placed_at)


async def test_an_empty_worker_is_stopped_after_the_grace_period():
    async with Setup(pool_grace_period_s=10.0) as s:
        await s.place("m")
        s.wall.advance(IDLE_S + 1)
        await s.sweep()  # the model goes; the worker is empty from now on
        await s.sweep()
        assert s.backend.stopped == []
        s.mono.advance(9)
        await s.sweep()
        assert s.backend.stopped == []
        s.mono.advance(2)
        await s.sweep()
        assert s.backend.stopped == ["w1"]
        assert await s.store.list_workers() == []


async def test_warm_workers_are_kept_and_started():
    async with Setup(pool_grace_period_s=0.0, warm_workers=1) as s:
        await s.sweep()
        assert s.backend.started == ["w1"]  # one warm worker started
        await s.sweep()
        assert s.backend.started == ["w1"]
        assert s.backend.stopped == []
        await s.place("m")  # takes the warm worker
        await s.sweep()
        assert s.backend.started == ["w1", "w2"]  # a new warm one
        s.wall.advance(IDLE_S + 1)
        await s.sweep()  # m goes: two empty workers, one is kept
        await s.sweep()
        assert len(s.backend.stopped) == 1
        assert len(s.backend.list_workers()) == 1


async def test_idle_workers_of_every_pool_are_stopped_and_warm_ones_started():
    vllm = PoolSettings(name="vllm", backends=("vllm",), max_workers=2, warm_workers=1)
    async with Setup(pool_grace_period_s=10.0, extra_pools=(vllm,)) as s:
        await s.place("onnx")
        await s.place("llm", backend="vllm")
        pools = {w.id: w.pool for w in s.backend.list_workers()}
        assert pools == {"w1": "default", "w2": "vllm"}
        await s.sweep()
        assert s.backend.started == ["w1", "w2", "w3"]  # the vllm pool's warm worker
        assert s.backend.list_workers("vllm")[-1].id == "w3"
        s.wall.advance(IDLE_S + 1)
        await s.sweep()  # both models go
        assert sorted(s.workers.unloads()) == [("w1", "onnx"), ("w2", "llm")]
        s.mono.advance(1)
        await s.sweep()  # w1 and w2 are seen empty, w3 has been for 1 s
        s.mono.advance(10)
        await s.sweep()
        # The default pool keeps no warm worker; the vllm pool keeps its most recently
        # emptied one.
        assert sorted(s.backend.stopped) == ["w1", "w3"]
        assert [w.id for w in s.backend.list_workers()] == ["w2"]


async def test_nothing_happens_while_not_acting():
    async with Setup() as s:
        await s.place("m")
        s.acting.is_acting = False
        s.wall.advance(10 * IDLE_S)
        # run() checks acting; sweep() is the unconditional seam, so drive run() briefly.
        task = asyncio.create_task(s.reaper.run())
        await asyncio.sleep(s.settings.reaper_interval_s * 1.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert await s.placed() == {"m"}


async def test_dead_workers_of_another_replica_are_removed():
    async with Setup(worker_health_failures=2) as s:
        await s.place("m")
        foreign = WorkerRecord(id="other-1", url="http://other-1", state=WorkerState.READY)
        alive = WorkerRecord(id="other-2", url="http://other-2", state=WorkerState.READY)
        s.liveness.live.add("http://other-2")
        for worker in (foreign, alive):
            await s.store.put_worker(worker)
            await s.store.add_placement(Placement(model="m", worker_id=worker.id, url=worker.url))
        await s.sweep()
        assert {w.id for w in await s.store.list_workers()} == {"w1", "other-1", "other-2"}
        await s.sweep()
        assert {w.id for w in await s.store.list_workers()} == {"w1", "other-2"}
        assert {p.worker_id for p in await s.store.list_placements()} == {"w1", "other-2"}


async def test_one_warm_worker_stays_stable_while_a_model_comes_and_goes():
    """warm_workers=1, max_workers>1: a model that takes the warm worker gets a replacement
    started; when it goes and comes back within the grace period, nothing more starts or
    stops (the replacement used to be stopped at once and started again, every time)."""
    async with Setup(pool_grace_period_s=10.0, warm_workers=1, max_workers=3) as s:
        await s.sweep()
        assert s.backend.started == ["w1"]
        await s.place("m")
        record = await s.store.get_model("m")
        assert record is not None
        for cycle in range(5):
            if cycle:
                await s.placer.place(record)
            await s.sweep()
            assert s.backend.started == ["w1", "w2"], cycle
            s.mono.advance(IDLE_S + 1)
            s.wall.advance(IDLE_S + 1)
            await s.sweep()  # m idles out: two empty workers, one too many
            for _ in range(3):  # back within the grace period
                s.mono.advance(1)
                s.wall.advance(1)
                await s.sweep()
            assert await s.placed() == set()
        assert s.backend.started == ["w1", "w2"]
        assert s.backend.stopped == []
        assert s.workers.loads() == [("w1", "m")] * 5


async def test_a_surplus_lasting_the_grace_period_stops_one_worker_then_stays():
    async with Setup(pool_grace_period_s=10.0, warm_workers=1, max_workers=3) as s:
        await s.sweep()
        await s.place("m")
        await s.sweep()  # the replacement warm worker starts
        s.mono.advance(1)
        await s.sweep()  # and is seen empty
        s.mono.advance(IDLE_S + 1)
        s.wall.advance(IDLE_S + 1)
        await s.sweep()
        await s.sweep()  # m gone: the surplus starts now
        s.mono.advance(9)
        await s.sweep()
        assert s.backend.stopped == []
        s.mono.advance(2)
        await s.sweep()
        # The replacement has been empty longest; the worker m used stays warm.
        assert s.backend.stopped == ["w2"]
        for _ in range(5):
            s.mono.advance(30)
            await s.sweep()
        assert s.backend.started == ["w1", "w2"]
        assert s.backend.stopped == ["w2"]
        assert [w.id for w in s.backend.list_workers()] == ["w1"]


def _decide(idle: list[str], state: PoolState, now: float, **pool: int) -> tuple[Any, PoolState]:
    shape = {"workers": len(idle), "starting": 0, "warm_workers": 1, "max_workers": 3}
    shape.update(pool)
    return decide_workers(idle, grace_s=10.0, state=state, now=now, **shape)


@pytest.mark.parametrize(
    ("idle", "state", "now", "pool", "stop", "start"),
    [
        pytest.param([], PoolState(), 0.0, {}, (), True, id="no-empty-worker-starts-one"),
        pytest.param([], PoolState(), 0.0, {"starting": 1}, (), False, id="one-starting"),
        pytest.param([], PoolState(), 0.0, {"workers": 3}, (), False, id="at-max-workers-no-start"),
        pytest.param(["a"], PoolState(), 0.0, {}, (), False, id="one-warm-is-enough"),
        pytest.param(
            ["a", "b"],
            PoolState({"a": 0.0, "b": 50.0}, surplus_since=50.0),
            55.0,
            {},
            (),
            False,
            id="surplus-younger-than-grace-stays",
        ),
        pytest.param(
            ["a", "b"],
            PoolState({"a": 0.0, "b": 50.0}, surplus_since=50.0),
            60.0,
            {},
            ("a",),
            False,
            id="surplus-past-grace-longest-empty-goes",
        ),
        pytest.param(
            ["a", "b"],
            PoolState({"a": 0.0, "b": 0.0}),
            100.0,
            {},
            (),
            False,
            id="surplus-just-seen-waits-its-grace",
        ),
        pytest.param(
            ["a", "b", "c"],
            PoolState({"a": 0.0, "b": 0.0, "c": 95.0}, surplus_since=0.0),
            100.0,
            {"warm_workers": 0},
            ("a", "b"),
            False,
            id="each-stopped-worker-empty-for-the-grace-too",
        ),
    ],
)
def test_decide_workers(
    idle: list[str],
    state: PoolState,
    now: float,
    pool: dict[str, int],
    stop: tuple[str, ...],
    start: bool,
):
    decision, after = _decide(idle, state, now, **pool)
    assert decision == WorkerDecision(stop=stop, start=start)
    assert set(after.empty_since) == set(idle)


def test_decide_workers_remembers_and_forgets():
    _, state = _decide(["a", "b"], PoolState(), 5.0)
    assert dict(state.empty_since) == {"a": 5.0, "b": 5.0}
    assert state.surplus_since == 5.0
    _, state = _decide(["a"], state, 7.0)  # b took work: no surplus, b forgotten
    assert dict(state.empty_since) == {"a": 5.0}
    assert state.surplus_since is None
    decision, state = _decide(["a", "b"], state, 8.0)
    assert state.surplus_since == 8.0 and state.empty_since["b"] == 8.0
    assert decision.stop == ()
