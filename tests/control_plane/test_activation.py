"""The orchestrator: one activation per burst, deadlines, timelines, store requests."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from control_plane.activation import Orchestrator
from control_plane.backends.base import PoolSpec
from control_plane.errors import (
    ActivationTimeoutError,
    LoadFailedError,
    ModelNotFoundError,
    NoCapacityError,
)
from control_plane.metrics import ControlPlaneMetrics
from control_plane.placement import Placer
from control_plane.store.memory import MemoryStateStore
from foundation.records import FirstResponse, ModelRecord
from tests.control_plane.fakes import Acting, FakeBackend, FakeWorkers, make_settings

pytestmark = pytest.mark.anyio


@dataclass
class Setup:
    store: MemoryStateStore
    backend: FakeBackend
    workers: FakeWorkers
    orchestrator: Orchestrator
    registry: CollectorRegistry
    acting: Acting

    async def register(self, name: str) -> None:
        await self.store.create_model(ModelRecord(name=name, storage_uri=f"/models/{name}"))


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    settings = make_settings(activation_timeout_s=0.5)
    store = MemoryStateStore()
    backend = FakeBackend()
    workers = FakeWorkers()
    pool = PoolSpec(name=settings.pool, max_workers=2)
    await backend.ensure_pool(pool)
    registry = CollectorRegistry()
    acting = Acting()
    placer = Placer(store, backend, pool, workers, settings)
    orchestrator = Orchestrator(store, placer, settings, ControlPlaneMetrics(registry), acting)
    yield Setup(store, backend, workers, orchestrator, registry, acting)
    await orchestrator.close()
    await placer.close()
    await store.close()


async def test_a_burst_makes_one_activation(setup: Setup):
    await setup.register("m")
    gate = setup.workers.load_gate = asyncio.Event()
    calls = [asyncio.create_task(setup.orchestrator("m")) for _ in range(50)]
    await asyncio.sleep(0.05)
    assert setup.orchestrator.pending("m") == 1
    assert setup.orchestrator.is_activating("m")
    gate.set()
    await asyncio.gather(*calls)
    assert setup.workers.loads() == [("w1", "m")]
    assert len(await setup.store.list_activations("m")) == 1
    assert not setup.orchestrator.is_activating("m")


async def test_an_active_model_is_not_activated_again(setup: Setup):
    await setup.register("m")
    first = await setup.orchestrator.activate("m")
    second = await setup.orchestrator.activate("m")
    assert first == second
    assert setup.workers.loads() == [("w1", "m")]


async def test_a_caller_giving_up_does_not_cancel_the_activation(setup: Setup):
    await setup.register("m")
    gate = setup.workers.load_gate = asyncio.Event()
    impatient = asyncio.create_task(setup.orchestrator.activate("m"))
    await asyncio.sleep(0.05)
    impatient.cancel()
    await asyncio.gather(impatient, return_exceptions=True)
    patient = asyncio.create_task(setup.orchestrator.activate("m"))
    gate.set()
    placement = await patient
    assert placement.worker_id == "w1"
    assert setup.workers.loads() == [("w1", "m")]


async def test_unknown_model(setup: Setup):
    with pytest.raises(ModelNotFoundError):
        await setup.orchestrator.activate("nope")
    timelines = await setup.store.list_activations("nope")
    assert timelines[0]["outcome"] == "failed"


async def test_deadline(setup: Setup):
    await setup.register("m")
    setup.workers.load_gate = asyncio.Event()  # never set
    with pytest.raises(ActivationTimeoutError, match="within 0.5 s"):
        await setup.orchestrator.activate("m")
    [timeline] = await setup.store.list_activations("m")
    assert timeline["outcome"] == "failed"
    assert "did not finish" in timeline["error"]


async def test_failure_is_recorded_and_raised(setup: Setup):
    await setup.register("m")
    setup.workers.fail_loads["m"] = "400: broken model"
    with pytest.raises(LoadFailedError):
        await setup.orchestrator.activate("m")
    [timeline] = await setup.store.list_activations("m")
    assert timeline["outcome"] == "failed"
    assert "broken model" in timeline["error"]
    count = setup.registry.get_sample_value(
        "zeroserve_activations_total", {"outcome": "failed", "trigger": "request"}
    )
    assert count == 1.0


async def test_timeline_phases_are_ordered(setup: Setup):
    await setup.register("m")
    await setup.orchestrator.activate("m", trigger="admin")
    [timeline] = await setup.store.list_activations("m")
    assert timeline["trigger"] == "admin"
    times = [p["at_s"] for p in timeline["phases"]]
    assert times == sorted(times)
    assert timeline["durations_s"]["worker"] <= timeline["durations_s"]["total"]
    assert timeline["worker"]["started"] is True


async def test_blocked_models_are_not_activated(setup: Setup):
    await setup.register("m")
    setup.orchestrator.block("m")
    with pytest.raises(ModelNotFoundError):
        await setup.orchestrator.activate("m")
    setup.orchestrator.unblock("m")
    await setup.orchestrator.activate("m")


async def test_add_replicas(setup: Setup):
    await setup.register("m")
    await setup.orchestrator.activate("m")
    setup.orchestrator.add_replicas("m", 1)
    assert setup.orchestrator.pending("m") == 1
    await setup.orchestrator.settle("m")
    assert sorted(p.worker_id for p in await setup.store.list_placements("m")) == ["w1", "w2"]


async def test_requests_through_the_store_are_served_while_acting(setup: Setup):
    await setup.register("m")
    await setup.register("n")
    runner = asyncio.create_task(setup.orchestrator.run())
    await asyncio.sleep(0)
    await setup.store.request_activation("m")
    for _ in range(200):
        if await setup.store.list_placements("m"):
            break
        await asyncio.sleep(0.01)
    assert [p.model for p in await setup.store.list_placements()] == ["m"]
    setup.acting.is_acting = False
    await setup.store.request_activation("n")
    await asyncio.sleep(0.5)
    assert await setup.store.list_placements("n") == []
    # Acting again (a failover): the request still pending is served, not forgotten.
    setup.acting.is_acting = True
    for _ in range(300):
        if await setup.store.list_placements("n"):
            break
        await asyncio.sleep(0.01)
    assert [p.model for p in await setup.store.list_placements("n")] == ["n"]
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)


# ---- first responses ----


def answered(
    timeline: dict[str, Any],
    *,
    after_ready_s: float = 0.5,
    waited_s: float = 5.0,
    worker_id: str = "w1",
    activator_id: str = "a1",
) -> FirstResponse:
    """A first response ``after_ready_s`` after ``timeline`` was ready, of a burst that asked
    ``waited_s`` before that response (so before the activation was queued, by default)."""
    ready_at = timeline["queued_at"] + timeline["durations_s"]["total"]
    return FirstResponse(
        model=timeline["model"],
        activator_id=activator_id,
        worker_id=worker_id,
        responded_at=ready_at + after_ready_s,
        waited_s=waited_s,
    )


def first_response_count(setup: Setup, cache: str) -> float | None:
    return setup.registry.get_sample_value(
        "zeroserve_activation_duration_seconds_count", {"phase": "first_response", "cache": cache}
    )


async def test_a_first_response_closes_its_activations_timeline_once(setup: Setup):
    await setup.register("m")
    await setup.orchestrator.activate("m")
    [timeline] = await setup.store.list_activations("m")
    assert await setup.orchestrator.record_first_response(answered(timeline)) is True
    [closed] = await setup.store.list_activations("m")
    assert closed["id"] == timeline["id"]
    assert [p["phase"] for p in closed["phases"]][-2:] == ["ready", "first_response"]
    expected = timeline["durations_s"]["total"] + 0.5
    assert closed["phases"][-1]["at_s"] == pytest.approx(expected, abs=1e-5)
    assert closed["durations_s"]["first_response"] == closed["phases"][-1]["at_s"]
    assert first_response_count(setup, closed["cache"]) == 1.0
    # Another activator's report of the same cold start: the first one stands.
    later = answered(timeline, after_ready_s=0.9, activator_id="a2")
    assert await setup.orchestrator.record_first_response(later) is False
    assert await setup.store.list_activations("m") == [closed]
    assert first_response_count(setup, closed["cache"]) == 1.0


async def test_a_first_response_is_never_put_before_ready(setup: Setup):
    await setup.register("m")
    await setup.orchestrator.activate("m")
    [timeline] = await setup.store.list_activations("m")
    assert await setup.orchestrator.record_first_response(answered(timeline, after_ready_s=-0.001))
    [closed] = await setup.store.list_activations("m")
    assert closed["durations_s"]["first_response"] == timeline["durations_s"]["total"]


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"worker_id": "w2"}, id="another-workers-replica"),
        pytest.param({"waited_s": 0.1}, id="asked-after-it-was-ready"),
    ],
)
async def test_a_first_response_leaves_timelines_it_does_not_close(
    setup: Setup, changes: dict[str, Any]
):
    await setup.register("m")
    await setup.orchestrator.activate("m")
    timelines = await setup.store.list_activations("m")
    assert (
        await setup.orchestrator.record_first_response(answered(timelines[0], **changes)) is False
    )
    assert await setup.store.list_activations("m") == timelines
    assert await setup.orchestrator.record_first_response(answered(timelines[0], worker_id="w1"))


async def test_a_first_response_skips_newer_failed_timelines(setup: Setup):
    await setup.register("m")
    await setup.orchestrator.activate("m")
    [timeline] = await setup.store.list_activations("m")
    await setup.store.add_activation("m", {"id": "f", "outcome": "failed", "worker": None}, keep=5)
    assert await setup.orchestrator.record_first_response(answered(timeline)) is True
    failed, closed = await setup.store.list_activations("m")
    assert failed["id"] == "f"
    assert closed["phases"][-1]["phase"] == "first_response"


async def test_a_first_response_that_overtakes_its_timeline_waits_for_it(setup: Setup):
    await setup.register("m")
    gate = setup.workers.load_gate = asyncio.Event()
    activation = asyncio.create_task(setup.orchestrator.activate("m"))
    await asyncio.sleep(0.05)
    assert setup.orchestrator.is_activating("m")
    report = FirstResponse("m", "a1", "w1", responded_at=time.time() + 1, waited_s=60)
    recording = asyncio.create_task(setup.orchestrator.record_first_response(report))
    await asyncio.sleep(0.05)
    assert not recording.done()
    gate.set()
    await activation
    assert await recording is True
    [closed] = await setup.store.list_activations("m")
    assert closed["phases"][-1]["phase"] == "first_response"


async def test_first_responses_through_the_store_are_recorded_while_acting(setup: Setup):
    await setup.register("m")
    await setup.orchestrator.activate("m")
    [timeline] = await setup.store.list_activations("m")
    runner = asyncio.create_task(setup.orchestrator.run())
    try:
        await setup.store.report_first_response(answered(timeline))
        for _ in range(300):
            [latest] = await setup.store.list_activations("m")
            if "first_response" in latest["durations_s"]:
                break
            await asyncio.sleep(0.01)
        assert latest["phases"][-1]["phase"] == "first_response"
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_a_first_response_the_store_fails_is_logged(
    setup: Setup, caplog: pytest.LogCaptureFixture
):
    await setup.register("m")
    await setup.orchestrator.activate("m")
    [timeline] = await setup.store.list_activations("m")
    await setup.store.close()
    with caplog.at_level(logging.WARNING, logger="control_plane.activation"):
        setup.orchestrator.first_response(answered(timeline))
        setup.orchestrator.first_response(answered(timeline, activator_id="a2"))  # dropped
        for _ in range(300):
            if "could not record the first response of m" in caplog.text:
                break
            await asyncio.sleep(0.01)
    assert caplog.text.count("could not record the first response of m") == 1


async def test_a_request_replaces_a_placement_whose_worker_is_dead():
    settings = make_settings(activation_timeout_s=5)
    store = MemoryStateStore()
    backend = FakeBackend()
    workers = FakeWorkers()
    pool = PoolSpec(name=settings.pool, max_workers=2)
    await backend.ensure_pool(pool)
    placer = Placer(store, backend, pool, workers, settings)
    dead: set[str] = set()

    async def probe(url: str) -> bool:
        return url not in dead

    orchestrator = Orchestrator(
        store, placer, settings, ControlPlaneMetrics(CollectorRegistry()), Acting(), probe=probe
    )
    try:
        await store.create_model(ModelRecord(name="m", storage_uri="/models/m"))
        first = await orchestrator.activate("m")
        # The autoscaler's own calls trust the store; only a request probes.
        dead.add(first.url)
        assert await orchestrator.activate("m", trigger="autoscaler") == first
        second = await orchestrator.activate("m")
        # The dead placement was dropped and the model activated again (the fake backend
        # offers the same worker id; a real one replaces the dead process).
        assert second.since > first.since
        assert workers.loads() == [("w1", "m"), ("w1", "m")]
        assert await store.list_placements("m") == [second]
        assert len(await store.list_activations("m")) == 2
    finally:
        await orchestrator.close()
        await placer.close()
        await store.close()


async def test_a_prewarm_is_an_activation_marked_as_such_that_evicts_nothing():
    settings = make_settings(max_workers=1, max_models_per_worker=1)
    store = MemoryStateStore()
    backend = FakeBackend()
    workers = FakeWorkers()
    pool = PoolSpec(name=settings.pool, max_workers=1)
    await backend.ensure_pool(pool)
    registry = CollectorRegistry()
    placer = Placer(store, backend, pool, workers, settings)
    orchestrator = Orchestrator(store, placer, settings, ControlPlaneMetrics(registry), Acting())
    try:
        for name in ("serving", "guessed"):
            await store.create_model(ModelRecord(name=name, storage_uri=f"/models/{name}"))
        await orchestrator.activate("serving")
        # The only room is the loaded model's: a pre-warm does not take it.
        with pytest.raises(NoCapacityError):
            await orchestrator.activate("guessed", trigger="prewarm")
        assert [p.model for p in await store.list_placements()] == ["serving"]
        assert ("w1", "serving") not in workers.unloads()
        [timeline] = await store.list_activations("guessed")
        assert (timeline["trigger"], timeline["outcome"]) == ("prewarm", "failed")
        failed = {"outcome": "failed", "trigger": "prewarm"}
        assert registry.get_sample_value("zeroserve_activations_total", failed) == 1.0
        # Its refusal backs nothing off: the request it guessed at evicts and loads at once.
        await orchestrator.activate("guessed")
        assert [p.model for p in await store.list_placements()] == ["guessed"]
        # With free room a pre-warm loads like any activation, its timeline marked.
        await store.delete_model("guessed")
        await orchestrator.activate("serving", trigger="prewarm")
        newest = (await store.list_activations("serving"))[0]
        assert (newest["trigger"], newest["outcome"]) == ("prewarm", "ready")
    finally:
        await orchestrator.close()
        await placer.close()
        await store.close()
