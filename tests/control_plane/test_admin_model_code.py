"""Models that are code (Python backend, PyTorch programs) register only where the operator
allows model code; the workers are then told the same with every load."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from control_plane.activation import Orchestrator
from control_plane.api.app import create_app
from control_plane.api.service import AdminService
from control_plane.backends.base import PoolSpec
from control_plane.metrics import ControlPlaneMetrics
from control_plane.placement import Placer
from control_plane.settings import ControlPlaneSettings
from control_plane.store.memory import MemoryStateStore
from control_plane.worker_client import WorkerClient, load_body
from foundation.records import ModelRecord, WorkerRecord
from tests.control_plane.fakes import Acting, FakeBackend, FakeWorkers, lifespan, make_settings

pytestmark = pytest.mark.anyio

TOKEN = "test-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SETTING = "ZEROSERVE_CONTROL_PLANE_ALLOW_MODEL_CODE"


async def admin(allow_model_code: bool) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(allow_model_code=allow_model_code)
    store = MemoryStateStore()
    backend = FakeBackend()
    pool = PoolSpec(name=settings.pool, max_workers=1)
    await backend.ensure_pool(pool)
    acting = Acting()
    registry = CollectorRegistry()
    placer = Placer(store, backend, pool, FakeWorkers(), settings)
    orchestrator = Orchestrator(store, placer, settings, ControlPlaneMetrics(registry), acting)
    app = create_app(
        AdminService(store, orchestrator, placer, backend, acting),
        token=TOKEN,
        registry=registry,
        acting=acting,
        allowed_storage=settings.allowed_storage,
        allow_model_code=settings.allow_model_code,
    )
    try:
        async with lifespan(app) as served:
            transport = httpx.ASGITransport(app=served, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
                yield client
    finally:
        await orchestrator.close()
        await placer.close()
        await store.close()


@pytest.fixture
async def refusing() -> AsyncIterator[httpx.AsyncClient]:
    async for client in admin(allow_model_code=False):
        yield client


@pytest.fixture
async def allowing() -> AsyncIterator[httpx.AsyncClient]:
    async for client in admin(allow_model_code=True):
        yield client


CODE_MODELS = [
    pytest.param({"backend": "python"}, "backend", id="python-backend"),
    pytest.param({"backend": "pytorch"}, "backend", id="pytorch-backend"),
    pytest.param({"platform": "pytorch_libtorch"}, "platform", id="torchscript-platform"),
    pytest.param({"config": {"backend": "python"}}, "config", id="python-in-config"),
    pytest.param({"config": {"platform": "pytorch_libtorch"}}, "config", id="torch-in-config"),
]


async def register(client: httpx.AsyncClient, name: str, **fields: Any) -> httpx.Response:
    body = {"name": name, "storage_uri": f"/models/{name}", **fields}
    return await client.post("/admin/v1/models", json=body, headers=AUTH)


@pytest.mark.parametrize(("fields", "at_fault"), CODE_MODELS)
async def test_code_models_are_refused_unless_allowed(
    refusing: httpx.AsyncClient, fields: dict[str, Any], at_fault: str
):
    response = await register(refusing, "m", **fields)
    assert response.status_code == 422, response.text
    assert response.json()["fields"] == [at_fault]
    assert SETTING in response.json()["error"]
    assert "code" in response.json()["error"]
    listed = await refusing.get("/admin/v1/models", headers=AUTH)
    assert listed.json()["models"] == []


async def test_a_change_to_a_code_backend_is_refused_too(refusing: httpx.AsyncClient):
    assert (await register(refusing, "m", backend="onnxruntime")).status_code == 201
    response = await refusing.patch("/admin/v1/models/m", json={"backend": "python"}, headers=AUTH)
    assert response.status_code == 422, response.text
    assert response.json()["fields"] == ["backend"]
    shown = await refusing.get("/admin/v1/models/m", headers=AUTH)
    assert shown.json()["backend"] == "onnxruntime"


async def test_models_that_are_not_code_register_either_way(refusing: httpx.AsyncClient):
    for name, fields in (
        ("plain", {}),
        ("onnx", {"backend": "onnxruntime"}),
        ("onnx-platform", {"platform": "onnxruntime_onnx"}),
        ("llm", {"backend": "transformers"}),
    ):
        response = await register(refusing, name, **fields)
        assert response.status_code == 201, (name, response.text)


@pytest.mark.parametrize(("fields", "at_fault"), CODE_MODELS)
async def test_code_models_register_where_allowed(
    allowing: httpx.AsyncClient, fields: dict[str, Any], at_fault: str
):
    response = await register(allowing, "m", **fields)
    assert response.status_code == 201, response.text


def test_the_setting_is_off_unless_set(monkeypatch: pytest.MonkeyPatch):
    assert ControlPlaneSettings().allow_model_code is False
    monkeypatch.setenv(SETTING, "true")
    assert ControlPlaneSettings().allow_model_code is True


async def test_workers_are_told_to_refuse_model_code_unless_allowed():
    bodies: list[dict[str, Any]] = []

    def worker(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"cache": "local", "bytes_fetched": 0, "fetch_s": 0.0})

    record = ModelRecord(name="m", storage_uri="/models/m")
    for allow in (False, True):
        client = WorkerClient(
            load_timeout_s=5,
            unload_timeout_s=5,
            allow_model_code=allow,
            transport=httpx.MockTransport(worker),
        )
        await client.load(WorkerRecord(id="w1", url="http://worker"), record)
        await client.close()
    assert bodies == [
        {"parameters": {"storage_uri": "/models/m", "allow_model_code": False}},
        {"parameters": {"storage_uri": "/models/m"}},
    ]
    assert load_body(record) == {"parameters": {"storage_uri": "/models/m"}}
