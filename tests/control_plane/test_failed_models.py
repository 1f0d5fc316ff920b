"""Loads that fail for good mark the model failed; loads that fail for a passing reason
back off. Through the orchestrator and the admin API, on a clock the tests move."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client import CollectorRegistry

from control_plane.activation import Orchestrator
from control_plane.api.app import create_app
from control_plane.api.service import AdminService
from control_plane.backends.base import PoolSpec
from control_plane.errors import ActivationBackoffError, LoadFailedError
from control_plane.metrics import ControlPlaneMetrics
from control_plane.placement import Placer
from control_plane.store.memory import MemoryStateStore
from foundation.errors import ModelFailedError
from foundation.records import ModelRecord
from tests.control_plane.fakes import Acting, FakeBackend, FakeWorkers, lifespan, make_settings
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio

TOKEN = "test-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REASON = "failed to load 'm', failed to poll from model repository: unknown backend 'x'"


@dataclass
class Setup:
    store: MemoryStateStore
    workers: FakeWorkers
    orchestrator: Orchestrator
    clock: FakeClock
    client: httpx.AsyncClient

    async def record(self) -> ModelRecord:
        record = await self.store.get_model("m")
        assert record is not None
        return record


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    settings = make_settings(activation_backoff_initial_s=2.0, activation_backoff_max_s=8.0)
    store = MemoryStateStore()
    backend = FakeBackend()
    workers = FakeWorkers()
    pool = PoolSpec(name=settings.pool, max_workers=2)
    await backend.ensure_pool(pool)
    acting = Acting()
    registry = CollectorRegistry()
    clock = FakeClock()
    placer = Placer(store, backend, pool, workers, settings)
    orchestrator = Orchestrator(
        store,
        placer,
        settings,
        ControlPlaneMetrics(registry),
        acting,
        clock=clock,
        wall=lambda: 1_700_000_000.0,
    )
    service = AdminService(store, orchestrator, placer, backend, acting)
    app = create_app(
        service,
        token=TOKEN,
        registry=registry,
        acting=acting,
        allowed_storage=settings.allowed_storage,
    )
    await store.create_model(ModelRecord(name="m", storage_uri="/models/m"))
    try:
        async with lifespan(app) as served:
            transport = httpx.ASGITransport(app=served, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
                yield Setup(store, workers, orchestrator, clock, client)
    finally:
        await orchestrator.close()
        await placer.close()
        await store.close()


# ---- for good ----


async def test_a_load_refused_for_good_marks_the_model_failed_once(setup: Setup):
    setup.workers.refuse_loads["m"] = REASON
    with pytest.raises(ModelFailedError) as raised:
        await setup.orchestrator.activate("m")
    assert raised.value.reason == REASON
    assert raised.value.failed_at == 1_700_000_000.0
    failure = (await setup.record()).failure
    assert failure is not None and failure.reason == REASON
    # Every later call, however many and whenever, is answered from the record.
    setup.clock.advance(3600)
    results = await asyncio.gather(
        *(setup.orchestrator.activate("m") for _ in range(20)), return_exceptions=True
    )
    assert all(isinstance(r, ModelFailedError) and r.reason == REASON for r in results)
    setup.orchestrator.add_replicas("m", 2)
    await asyncio.sleep(0)
    assert setup.workers.attempts == ["m"]
    [timeline] = await setup.store.list_activations("m")
    assert timeline["outcome"] == "failed" and timeline["is_permanent"] is True


async def test_the_admin_api_shows_the_reason_and_time(setup: Setup):
    setup.workers.refuse_loads["m"] = REASON
    loaded = await setup.client.post("/admin/v1/models/m/load", headers=AUTH)
    assert loaded.status_code == 424
    assert loaded.json()["error"].endswith(REASON)
    for response in (
        await setup.client.get("/admin/v1/models/m", headers=AUTH),
        await setup.client.get("/admin/v1/models", headers=AUTH),
    ):
        body = response.json()
        view = body["models"][0] if "models" in body else body
        assert view["status"]["state"] == "failed"
        assert view["status"]["failure"] == {"reason": REASON, "failed_at": 1_700_000_000.0}


async def test_an_explicit_load_tries_a_failed_model_again(setup: Setup):
    setup.workers.refuse_loads["m"] = REASON
    with pytest.raises(ModelFailedError):
        await setup.orchestrator.activate("m")
    del setup.workers.refuse_loads["m"]  # the files were fixed in place
    loaded = await setup.client.post("/admin/v1/models/m/load", headers=AUTH)
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["status"]["state"] == "ready"
    assert loaded.json()["status"]["failure"] is None
    assert setup.workers.attempts == ["m", "m"]


async def test_a_change_that_reloads_clears_the_failure_and_scaling_does_not(setup: Setup):
    setup.workers.refuse_loads["m"] = REASON
    with pytest.raises(ModelFailedError):
        await setup.orchestrator.activate("m")
    scaled = await setup.client.patch(
        "/admin/v1/models/m", json={"scaling": {"max_replicas": 3}}, headers=AUTH
    )
    assert scaled.json()["status"]["failure"] is not None
    moved = await setup.client.patch(
        "/admin/v1/models/m", json={"storage_uri": "/models/m2"}, headers=AUTH
    )
    assert moved.status_code == 200
    assert moved.json()["status"]["failure"] is None
    del setup.workers.refuse_loads["m"]
    await setup.orchestrator.activate("m")
    assert setup.workers.attempts[-1] == "m" and len(setup.workers.attempts) >= 2


async def test_a_registration_changed_during_the_failing_load_is_not_marked(setup: Setup):
    setup.workers.refuse_loads["m"] = REASON
    gate = setup.workers.load_gate = asyncio.Event()
    activation = asyncio.create_task(setup.orchestrator.activate("m"))
    await asyncio.sleep(0.05)
    record = await setup.record()
    await setup.store.update_model(
        dataclasses.replace(record, storage_uri="/models/fixed", generation=2)
    )
    gate.set()
    with pytest.raises(ModelFailedError):
        await activation
    assert (await setup.record()).failure is None


# ---- for a passing reason ----


async def test_passing_failures_back_off_doubling_and_an_admin_load_does_not_wait(setup: Setup):
    setup.workers.fail_loads["m"] = "503: the store is unreachable"
    with pytest.raises(LoadFailedError):
        await setup.orchestrator.activate("m")
    assert (await setup.record()).failure is None
    for _ in range(10):
        with pytest.raises(ActivationBackoffError) as raised:
            await setup.orchestrator.activate("m")
    assert raised.value.retry_after_s == 2
    assert "the store is unreachable" in raised.value.message
    setup.orchestrator.add_replicas("m", 1)
    await asyncio.sleep(0)
    assert setup.workers.attempts == ["m"]

    setup.clock.advance(2.0)
    with pytest.raises(LoadFailedError):
        await setup.orchestrator.activate("m")
    setup.clock.advance(1.0)
    with pytest.raises(ActivationBackoffError) as raised:
        await setup.orchestrator.activate("m")
    assert raised.value.retry_after_s == 3  # 4 s after the second failure, 1 s gone
    assert setup.workers.attempts == ["m", "m"]

    del setup.workers.fail_loads["m"]
    await setup.orchestrator.activate("m", trigger="admin")
    assert setup.workers.attempts == ["m", "m", "m"]


async def test_a_success_forgets_the_backoff(setup: Setup):
    setup.workers.fail_loads["m"] = "503: the store is unreachable"
    with pytest.raises(LoadFailedError):
        await setup.orchestrator.activate("m")
    del setup.workers.fail_loads["m"]
    setup.clock.advance(2.0)
    await setup.orchestrator.activate("m")
    await setup.client.post("/admin/v1/models/m/unload", headers=AUTH)
    # Down again right away: no wait is left over from before the success.
    setup.workers.fail_loads["m"] = "503: the store is unreachable"
    with pytest.raises(LoadFailedError):
        await setup.orchestrator.activate("m")
    with pytest.raises(ActivationBackoffError) as raised:
        await setup.orchestrator.activate("m")
    assert raised.value.retry_after_s == 2
