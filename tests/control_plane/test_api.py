"""The admin API in process: auth, schemas, every C10 mapping, and the model lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from control_plane import usage
from control_plane.activation import Orchestrator
from control_plane.api.app import create_app
from control_plane.api.service import AdminService, ServedVersions
from control_plane.backends.base import PoolSpec
from control_plane.metrics import ControlPlaneMetrics
from control_plane.placement import Placer
from control_plane.store.errors import StoreUnavailableError
from control_plane.store.memory import MemoryStateStore
from foundation.records import TrafficReport
from tests.control_plane.fakes import Acting, FakeBackend, FakeWorkers, lifespan, make_settings

pytestmark = pytest.mark.anyio

TOKEN = "test-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Api:
    client: httpx.AsyncClient
    store: MemoryStateStore
    backend: FakeBackend
    workers: FakeWorkers
    acting: Acting
    registry: CollectorRegistry

    async def register(self, name: str = "m", **fields: Any) -> httpx.Response:
        body = {"name": name, "storage_uri": f"/models/{name}", **fields}
        return await self.client.post("/admin/v1/models", json=body, headers=AUTH)


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as served:
        yield served


@contextlib.asynccontextmanager
async def running_api(*, versions: ServedVersions | None = None) -> AsyncIterator[Api]:
    """The admin API over the in-memory store, a fake backend and fake workers, in process;
    ``versions`` asks workers for a model's served versions (none: never asked)."""
    settings = make_settings()
    store = MemoryStateStore()
    backend = FakeBackend()
    workers = FakeWorkers()
    pool = PoolSpec(name=settings.pool, max_workers=2)
    await backend.ensure_pool(pool)
    acting = Acting()
    registry = CollectorRegistry()
    metrics = ControlPlaneMetrics(registry)
    placer = Placer(store, backend, pool, workers, settings)
    orchestrator = Orchestrator(store, placer, settings, metrics, acting)
    service = AdminService(store, orchestrator, placer, backend, acting, versions=versions)
    app = create_app(
        service,
        token=TOKEN,
        registry=registry,
        acting=acting,
        allowed_storage=settings.allowed_storage,
    )
    try:
        async with lifespan(app) as served:
            transport = httpx.ASGITransport(app=served, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
                yield Api(client, store, backend, workers, acting, registry)
    finally:
        await orchestrator.close()
        await placer.close()
        await store.close()


def error_of(response: httpx.Response) -> str:
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert isinstance(body["error"], str) and body["error"]
    return str(body["error"])


# ---- auth ----


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="missing"),
        pytest.param({"Authorization": "Bearer wrong-token"}, id="wrong"),
        pytest.param({"Authorization": f"Basic {TOKEN}"}, id="not-bearer"),
        pytest.param({"Authorization": f"Bearer {TOKEN}x"}, id="longer"),
    ],
)
async def test_missing_or_wrong_token_is_401(api: Api, headers: dict[str, str]):
    for method, path in [
        ("GET", "/admin/v1/models"),
        ("POST", "/admin/v1/models"),
        ("GET", "/admin/v1/workers"),
        ("DELETE", "/admin/v1/models/m"),
        ("GET", "/admin/v1/models/m/usage"),
    ]:
        response = await api.client.request(method, path, headers=headers)
        assert response.status_code == 401, (method, path)
        assert "token" in error_of(response) or "Bearer" in error_of(response)
        assert response.headers["www-authenticate"].startswith("Bearer")


async def test_bearer_scheme_is_case_insensitive(api: Api):
    response = await api.client.get(
        "/admin/v1/models", headers={"Authorization": f"bearer {TOKEN}"}
    )
    assert response.status_code == 200


async def test_openapi_metrics_and_health_need_no_token(api: Api):
    doc = (await api.client.get("/admin/v1/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    assert set(doc["paths"]) == {
        "/admin/v1/models",
        "/admin/v1/models/{name}",
        "/admin/v1/models/{name}/load",
        "/admin/v1/models/{name}/unload",
        "/admin/v1/models/{name}/activations",
        "/admin/v1/models/{name}/usage",
        "/admin/v1/workers",
        "/admin/v1/keys",
        "/admin/v1/keys/{key_id}",
        "/admin/v1/keys/{key_id}/revoke",
    }
    create = doc["paths"]["/admin/v1/models"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ModelCreate"
    }
    schemas = doc["components"]["schemas"]
    assert {"ModelCreate", "ModelPatch", "ModelView", "ScalingSpec", "ErrorBody"} <= set(schemas)
    assert "min_replicas" in schemas["ScalingSpec"]["properties"]
    assert (await api.client.get("/metrics")).status_code == 200
    assert (await api.client.get("/healthz")).json() == {"live": True, "acting": True}


# ---- C10: every mapping, status and body ----


async def test_400_malformed_json(api: Api):
    response = await api.client.post("/admin/v1/models", content=b'{"name": "m",', headers=AUTH)
    assert response.status_code == 400
    assert "malformed JSON" in error_of(response)


async def test_400_body_not_an_object(api: Api):
    response = await api.client.post("/admin/v1/models", json=["m"], headers=AUTH)
    assert response.status_code == 400
    assert "JSON object" in error_of(response)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param({"storage_uri": "/models/m"}, "name", id="name-missing"),
        pytest.param({"name": "a/b", "storage_uri": "/models/m"}, "name", id="name-traversal"),
        pytest.param({"name": "m"}, "storage_uri", id="uri-missing"),
        pytest.param({"name": "m", "storage_uri": "/etc/passwd"}, "storage_uri", id="not-allowed"),
        pytest.param({"name": "m", "storage_uri": "ftp://x/y"}, "storage_uri", id="bad-scheme"),
        pytest.param(
            {"name": "m", "storage_uri": "/models/m", "scaling": {"min_replicas": -1}},
            "scaling.min_replicas",
            id="negative-min",
        ),
        pytest.param(
            {"name": "m", "storage_uri": "/models/m", "scaling": {"target_concurrency": 0}},
            "scaling.target_concurrency",
            id="zero-target",
        ),
        pytest.param(
            {"name": "m", "storage_uri": "/models/m", "scaling": {"min_replicas": 3}},
            "scaling",
            id="min-over-max",
        ),
        pytest.param(
            {"name": "m", "storage_uri": "/models/m", "resources": {"device": "tpu"}},
            "resources.device",
            id="device",
        ),
        pytest.param(
            {"name": "m", "storage_uri": "/models/m", "config": {"bogus_field": 1}},
            "config",
            id="config-not-triton",
        ),
        pytest.param(
            {"name": "m", "storage_uri": "/models/m", "config": {"name": "other"}},
            "body",
            id="config-name-differs",
        ),
        pytest.param(
            {"name": "m", "storage_uri": "/models/m", "replicas": 2}, "replicas", id="unknown"
        ),
    ],
)
async def test_422_names_the_field(api: Api, body: dict[str, Any], field: str):
    response = await api.client.post("/admin/v1/models", json=body, headers=AUTH)
    assert response.status_code == 422, response.text
    assert field in response.json()["fields"]
    assert field.split(".")[-1] in error_of(response) or field == "body"


async def test_404_unknown_model(api: Api):
    for method, path in [
        ("GET", "/admin/v1/models/nope"),
        ("PATCH", "/admin/v1/models/nope"),
        ("DELETE", "/admin/v1/models/nope"),
        ("POST", "/admin/v1/models/nope/load"),
        ("POST", "/admin/v1/models/nope/unload"),
        ("GET", "/admin/v1/models/nope/activations"),
    ]:
        kwargs: dict[str, Any] = {"json": {}} if method == "PATCH" else {}
        response = await api.client.request(method, path, headers=AUTH, **kwargs)
        assert response.status_code == 404, (method, path)
        assert error_of(response) == "model 'nope' is not registered"


async def test_409_registered_twice(api: Api):
    assert (await api.register("m")).status_code == 201
    response = await api.register("m")
    assert response.status_code == 409
    assert error_of(response) == "model 'm' is registered already"


async def test_503_no_capacity_with_retry_after(api: Api):
    assert (await api.register("g", resources={"device": "cuda"})).status_code == 201
    response = await api.client.post("/admin/v1/models/g/load", headers=AUTH)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "5"
    assert "no cuda workers" in error_of(response)


async def test_503_not_acting_with_retry_after(api: Api):
    await api.register("m")
    api.acting.is_acting = False
    for path in ("/admin/v1/models/m/unload",):
        response = await api.client.post(path, headers=AUTH)
        assert response.status_code == 503
        assert response.headers["retry-after"] == "2"
        assert "not acting" in error_of(response)
    response = await api.client.delete("/admin/v1/models/m", headers=AUTH)
    assert response.status_code == 503
    # A load is passed on to the acting replica through the store instead.
    response = await api.client.post("/admin/v1/models/m/load", headers=AUTH)
    assert response.status_code == 202
    assert response.json()["status"]["state"] == "scaled_to_zero"


async def test_503_store_unavailable(api: Api):
    await api.store.close()
    response = await api.client.get("/admin/v1/models", headers=AUTH)
    assert response.status_code == 503
    assert "retry-after" in response.headers
    assert "state store" in error_of(response)


async def test_502_worker_refuses_the_load(api: Api):
    await api.register("bad")
    api.workers.fail_loads["bad"] = "400: failed to parse config"
    response = await api.client.post("/admin/v1/models/bad/load", headers=AUTH)
    assert response.status_code == 502
    assert "failed to parse config" in error_of(response)
    status = (await api.client.get("/admin/v1/models/bad", headers=AUTH)).json()["status"]
    assert status["state"] == "failed"
    assert status["last_activation"]["outcome"] == "failed"


async def test_500_unexpected_error_is_generic(api: Api):
    async def broken(name: str) -> None:
        raise RuntimeError("secret internals")

    api.store.list_activations = broken  # type: ignore[assignment,method-assign]
    await api.register("m")
    response = await api.client.get("/admin/v1/models/m/activations", headers=AUTH)
    assert response.status_code == 500
    assert error_of(response) == "internal server error"


async def test_405_and_unknown_path(api: Api):
    response = await api.client.put("/admin/v1/models", headers=AUTH)
    assert response.status_code == 405
    assert error_of(response) == "Method Not Allowed"
    response = await api.client.get("/admin/v1/nothing", headers=AUTH)
    assert response.status_code == 404


# ---- the lifecycle ----


async def test_register_list_show(api: Api):
    response = await api.register(
        "m",
        backend="onnxruntime",
        config={"name": "m", "max_batch_size": 8},
        scaling={"min_replicas": 0, "max_replicas": 2, "idle_timeout_s": 5},
        resources={"memory_bytes": 1000},
    )
    assert response.status_code == 201
    view = response.json()
    assert view["name"] == "m"
    assert view["scaling"] == {
        "min_replicas": 0,
        "max_replicas": 2,
        "target_concurrency": 8.0,
        "idle_timeout_s": 5.0,
        "sleep_after_s": 0.0,
        "policy": "fixed",
    }
    assert view["resources"] == {"device": "cpu", "memory_bytes": 1000}
    assert view["generation"] == 1
    assert view["status"] == {
        "state": "scaled_to_zero",
        "replicas": [],
        "sleeping": [],
        "served_versions": None,
        "in_flight": 0,
        "last_request_at": None,
        "last_activation": None,
        "failure": None,
    }
    listed = (await api.client.get("/admin/v1/models", headers=AUTH)).json()
    assert [m["name"] for m in listed["models"]] == ["m"]
    shown = (await api.client.get("/admin/v1/models/m", headers=AUTH)).json()
    assert shown == view


async def test_load_shows_replicas_and_a_timeline_then_unload(api: Api):
    await api.register("m")
    response = await api.client.post("/admin/v1/models/m/load", headers=AUTH)
    assert response.status_code == 200
    status = response.json()["status"]
    assert status["state"] == "ready"
    assert [r["worker_id"] for r in status["replicas"]] == ["w1"]
    timeline = status["last_activation"]
    assert timeline["outcome"] == "ready"
    assert timeline["trigger"] == "admin"
    assert timeline["worker"] == {"id": "w1", "url": "http://worker-1", "started": True}
    assert timeline["cache"] == "hit"
    assert [p["phase"] for p in timeline["phases"]] == [
        "queued",
        "worker_ready",
        "fetched",
        "engine_built",
        "ready",
    ]
    assert timeline["durations_s"]["total"] >= 0
    activations = (await api.client.get("/admin/v1/models/m/activations", headers=AUTH)).json()
    assert activations["model"] == "m"
    assert [a["id"] for a in activations["activations"]] == [timeline["id"]]
    workers = (await api.client.get("/admin/v1/workers", headers=AUTH)).json()["workers"]
    assert [(w["id"], w["models"], w["details"], w["grpc_address"]) for w in workers] == [
        ("w1", ["m"], {"fake": True}, "")  # the fake backend's workers serve no gRPC
    ]
    metrics = (await api.client.get("/metrics")).text
    assert 'zeroserve_activation_duration_seconds_count{cache="hit",phase="total"} 1.0' in metrics

    # A second load of a loaded model changes nothing.
    again = await api.client.post("/admin/v1/models/m/load", headers=AUTH)
    assert again.status_code == 200
    assert api.workers.loads() == [("w1", "m")]

    response = await api.client.post("/admin/v1/models/m/unload", headers=AUTH)
    assert response.status_code == 200
    assert response.json()["status"]["state"] == "scaled_to_zero"
    assert api.workers.unloads() == [("w1", "m")]


async def test_status_reports_traffic(api: Api):
    await api.register("m")
    await api.store.report_traffic(TrafficReport("m", "a1", 3, 1234.5, 1234.5))
    status = (await api.client.get("/admin/v1/models/m", headers=AUTH)).json()["status"]
    assert status["in_flight"] == 3
    assert status["last_request_at"] == 1234.5


async def test_patch_scaling_and_storage(api: Api):
    await api.register("m")
    await api.client.post("/admin/v1/models/m/load", headers=AUTH)
    response = await api.client.patch(
        "/admin/v1/models/m", json={"scaling": {"max_replicas": 3}}, headers=AUTH
    )
    assert response.status_code == 200
    view = response.json()
    assert view["scaling"]["max_replicas"] == 3
    assert view["generation"] == 2
    assert api.workers.loads() == [("w1", "m")]  # scaling alone reloads nothing

    response = await api.client.patch(
        "/admin/v1/models/m", json={"storage_uri": "/models/m-v2"}, headers=AUTH
    )
    assert response.status_code == 200
    assert response.json()["storage_uri"] == "/models/m-v2"
    for _ in range(100):
        if len(api.workers.loads()) == 2:
            break
        await asyncio.sleep(0.01)
    assert api.workers.loads() == [("w1", "m"), ("w1", "m")]


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        pytest.param({"scaling": {"min_replicas": 5}}, "scaling", id="merged-min-over-max"),
        pytest.param({"scaling": {"max_replicas": 0}}, "scaling.max_replicas", id="max-zero"),
        pytest.param({"storage_uri": "/etc"}, "storage_uri", id="not-allowed"),
        pytest.param({"name": "x"}, "name", id="name-is-fixed"),
    ],
)
async def test_patch_422_names_the_field(api: Api, patch: dict[str, Any], field: str):
    await api.register("m")
    response = await api.client.patch("/admin/v1/models/m", json=patch, headers=AUTH)
    assert response.status_code == 422, response.text
    assert field in response.json()["fields"]


async def test_delete_unloads_then_forgets(api: Api):
    await api.register("m")
    await api.client.post("/admin/v1/models/m/load", headers=AUTH)
    response = await api.client.delete("/admin/v1/models/m", headers=AUTH)
    assert response.status_code == 204
    assert api.workers.unloads() == [("w1", "m")]
    assert (await api.client.get("/admin/v1/models/m", headers=AUTH)).status_code == 404
    assert (await api.register("m")).status_code == 201


async def test_store_failure_while_unavailable_is_not_a_500(api: Api):
    async def down(name: str) -> None:
        raise StoreUnavailableError(store="memory", operation="get_model", reason="gone")

    api.store.get_model = down  # type: ignore[method-assign]
    response = await api.client.get("/admin/v1/models/m", headers=AUTH)
    assert response.status_code == 503


async def test_unload_right_after_a_storage_change_stays_unloaded(api: Api):
    await api.register("m")
    await api.client.post("/admin/v1/models/m/load", headers=AUTH)
    gate = api.workers.load_gate = asyncio.Event()
    response = await api.client.patch(
        "/admin/v1/models/m", json={"storage_uri": "/models/m-v2"}, headers=AUTH
    )
    assert response.status_code == 200
    # The reload is now held at its load; the unload must wait for it, not race it.
    unload = asyncio.create_task(api.client.post("/admin/v1/models/m/unload", headers=AUTH))
    await asyncio.sleep(0.05)
    gate.set()
    response = await unload
    assert response.status_code == 200
    # Let the reload's load finish whatever the unload did, then look.
    async with asyncio.timeout(30):
        while len(api.workers.loads()) < 2:  # noqa: ASYNC110 - the fake has no event for loads
            await asyncio.sleep(0.01)
    for _ in range(10):
        await asyncio.sleep(0)
    assert await api.store.list_placements("m") == []
    status = (await api.client.get("/admin/v1/models/m", headers=AUTH)).json()["status"]
    assert status["state"] == "scaled_to_zero"


# ---- usage ----


async def test_usage_over_a_range_sums_the_hours_it_overlaps(api: Api):
    assert (await api.register("m")).status_code == 201
    ledger = usage.UsageLedger()
    hour = usage.BUCKET_S
    ledger = usage.add(ledger, usage.Usage(serving_s=100.0), start=hour, end=hour + 100)
    ledger = usage.add(ledger, usage.Usage(idle_s=600.0), start=3 * hour, end=3 * hour + 600)
    ledger = usage.add(
        ledger,
        usage.Usage(loading_s=5.0, activations=1, cold_starts=1, cold_start_wait_s=6.0),
        start=3 * hour,
        end=3 * hour,
    )
    await api.store.put_model_state("m", usage.STATE_KEY, ledger.to_json())
    response = await api.client.get(
        "/admin/v1/models/m/usage", params={"start": 3 * hour, "end": 4 * hour}, headers=AUTH
    )
    assert response.status_code == 200
    doc = response.json()
    assert doc["replica_seconds"] == {"serving": 0.0, "idle": 600.0, "loading": 5.0}
    assert (doc["activations"], doc["cold_starts"], doc["cold_start_wait_s"]) == (1, 1, 6.0)
    assert doc["device"] == "cpu"
    everything = await api.client.get(
        "/admin/v1/models/m/usage", params={"start": 0, "end": 5 * hour}, headers=AUTH
    )
    assert everything.json()["replica_seconds"]["serving"] == 100.0


@pytest.mark.parametrize(
    ("path", "params", "status"),
    [
        pytest.param("/admin/v1/models/nope/usage", {}, 404, id="unknown-model"),
        pytest.param("/admin/v1/models/m/usage", {"start": "yesterday"}, 422, id="not-a-time"),
        pytest.param(
            "/admin/v1/models/m/usage", {"start": 10, "end": 5}, 422, id="start-after-end"
        ),
    ],
)
async def test_usage_errors(api: Api, path: str, params: dict[str, Any], status: int):
    assert (await api.register("m")).status_code == 201
    response = await api.client.get(path, params=params, headers=AUTH)
    assert response.status_code == status
    assert error_of(response)
