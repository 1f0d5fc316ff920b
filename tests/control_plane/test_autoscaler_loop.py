"""The autoscaler loop: gathers what the policy needs and applies what it decides."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from control_plane.autoscaler.loop import AutoscalerLoop
from control_plane.autoscaler.policy import AutoscalerSettings
from control_plane.metrics import ControlPlaneMetrics
from control_plane.store.memory import MemoryStateStore
from foundation.records import ModelRecord, Placement, ScalingSpec, TrafficReport
from tests.control_plane.fakes import Acting
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio


@dataclass
class Recorder:
    pending_by_model: dict[str, int] = field(default_factory=dict)
    added: list[tuple[str, int]] = field(default_factory=list)
    retired: list[tuple[str, str]] = field(default_factory=list)

    def pending(self, model: str) -> int:
        return self.pending_by_model.get(model, 0)

    def add_replicas(self, model: str, count: int, *, trigger: str = "autoscaler") -> None:
        self.added.append((model, count))

    def retire_soon(self, model: str, worker_id: str, *, reason: str) -> None:
        self.retired.append((model, worker_id))


@dataclass
class Setup:
    store: MemoryStateStore
    recorder: Recorder
    clock: FakeClock
    loop: AutoscalerLoop
    registry: CollectorRegistry

    async def model(self, name: str, replicas: int = 0, **scaling: float) -> None:
        spec = ScalingSpec(**scaling)  # type: ignore[arg-type]
        await self.store.create_model(ModelRecord(name=name, storage_uri="/m", scaling=spec))
        for i in range(replicas):
            await self.store.add_placement(
                Placement(model=name, worker_id=f"w{i}", url=f"http://w{i}", since=float(i))
            )

    async def traffic(self, name: str, in_flight: int) -> None:
        now = time.time()
        await self.store.report_traffic(TrafficReport(name, "a1", in_flight, now, now))


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    store = MemoryStateStore()
    recorder = Recorder()
    clock = FakeClock(100.0)
    registry = CollectorRegistry()
    loop = AutoscalerLoop(
        store,
        recorder,
        recorder,
        AutoscalerSettings(),
        ControlPlaneMetrics(registry),
        Acting(),
        tick_s=2.0,
        clock=clock,
    )
    yield Setup(store, recorder, clock, loop, registry)
    await store.close()


async def test_min_replicas_are_brought_up(setup: Setup):
    await setup.model("m", min_replicas=2, max_replicas=3)
    await setup.loop.tick()
    assert setup.recorder.added == [("m", 2)]


async def test_pending_activations_count(setup: Setup):
    await setup.model("m", min_replicas=2, max_replicas=3)
    setup.recorder.pending_by_model["m"] = 2
    await setup.loop.tick()
    assert setup.recorder.added == []


async def test_buffered_requests_at_zero_take_the_fast_path(setup: Setup):
    await setup.model("m")
    await setup.traffic("m", 5)
    await setup.loop.tick()
    assert setup.recorder.added == [("m", 1)]


async def test_an_idle_model_at_zero_stays_there(setup: Setup):
    await setup.model("m")
    await setup.loop.tick()
    assert setup.recorder.added == []


async def test_load_scales_up_to_max(setup: Setup):
    await setup.model("m", replicas=1, max_replicas=4, target_concurrency=2.0)
    await setup.traffic("m", 20)
    await setup.loop.tick()
    assert setup.recorder.added == [("m", 3)]
    desired = setup.registry.get_sample_value("zeroserve_model_desired_replicas", {"model": "m"})
    assert desired == 4.0


async def test_scale_down_keeps_the_last_replica_for_the_reaper(setup: Setup):
    await setup.model("m", replicas=3, max_replicas=3)
    await setup.traffic("m", 0)
    for _ in range(40):  # past the stable window and the panic a fresh state starts in
        setup.clock.advance(2.0)
        await setup.loop.tick()
        if setup.recorder.retired:
            break
    # Newest replicas go first; one always stays (the reaper's to take).
    assert setup.recorder.retired == [("m", "w2"), ("m", "w1")]


async def test_deleted_models_are_forgotten(setup: Setup):
    await setup.model("m", replicas=1)
    await setup.loop.tick()
    assert setup.registry.get_sample_value("zeroserve_model_replicas", {"model": "m"}) == 1.0
    await setup.store.delete_model("m")
    await setup.loop.tick()
    assert setup.registry.get_sample_value("zeroserve_model_replicas", {"model": "m"}) is None
