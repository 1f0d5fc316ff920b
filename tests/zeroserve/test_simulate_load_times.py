"""``zeroserve simulate --load-times-from-api``: each model's median measured load time read
from a real admin API (served on loopback, in process), the others at ``--load-s``."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import statistics
from collections.abc import AsyncIterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from control_plane.activation import Orchestrator
from control_plane.api.app import create_app
from control_plane.api.service import AdminService
from control_plane.backends.base import PoolSpec
from control_plane.metrics import ControlPlaneMetrics
from control_plane.placement import Placer
from control_plane.store.memory import MemoryStateStore
from tests.control_plane.fakes import Acting, FakeBackend, FakeWorkers, make_settings
from tests.uvicorn_server import serving
from zeroserve.cli import main
from zeroserve.simulate import median_load_s

pytestmark = pytest.mark.anyio

TOKEN = "test-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@contextlib.asynccontextmanager
async def served_admin_api() -> AsyncIterator[str]:
    """The admin API over the in-memory store and fake workers, under uvicorn on a free
    loopback port; yields its URL."""
    settings = make_settings()
    store = MemoryStateStore()
    backend = FakeBackend()
    workers = FakeWorkers()
    pool = PoolSpec(name=settings.pool, max_workers=2)
    await backend.ensure_pool(pool)
    acting = Acting()
    registry = CollectorRegistry()
    placer = Placer(store, backend, pool, workers, settings)
    orchestrator = Orchestrator(store, placer, settings, ControlPlaneMetrics(registry), acting)
    service = AdminService(store, orchestrator, placer, backend, acting)
    app = create_app(
        service,
        token=TOKEN,
        registry=registry,
        acting=acting,
        allowed_storage=settings.allowed_storage,
    )
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_config=None)
    try:
        async with serving(uvicorn.Server(config)) as url:
            yield url
    finally:
        await orchestrator.close()
        await placer.close()
        await store.close()


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


async def test_simulate_uses_the_median_measured_load_time_per_model(tmp_path: Path):
    trace = tmp_path / "trace.csv"
    rows = [f"{60 * i},{name}" for i in range(30) for name in ("m-a", "m-b", "m-c")]
    trace.write_text("timestamp,model\n" + "\n".join(rows) + "\n")
    async with (
        served_admin_api() as url,
        httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30.0) as client,
    ):
        for name in ("m-a", "m-b"):  # m-c is not registered
            body = {"name": name, "storage_uri": f"/models/{name}"}
            assert (await client.post("/admin/v1/models", json=body)).status_code == 201
        for _ in range(3):  # m-a loaded three times; m-b never
            assert (await client.post("/admin/v1/models/m-a/load")).status_code == 200
            assert (await client.post("/admin/v1/models/m-a/unload")).status_code == 200
        timelines = (await client.get("/admin/v1/models/m-a/activations")).json()["activations"]
        totals = [t["durations_s"]["total"] for t in timelines if t["outcome"] == "ready"]
        assert len(totals) == 3
        argv = ["simulate", str(trace), "--load-s", "42", "-o", "json", "--load-times-from-api"]
        # The command blocks on its HTTP calls: off the loop that serves them.
        status, out, err = await asyncio.to_thread(_run, [*argv, "--url", url, "--token", TOKEN])
        assert status == 0, err
        assert json.loads(out)["load_s"] == {
            "m-a": pytest.approx(statistics.median(totals)),
            "m-b": 42.0,
            "m-c": 42.0,
        }
        status, _, err = await asyncio.to_thread(
            _run, [*argv, "--url", url, "--token", "wrong-token"]
        )
        assert status == 2
        assert "401" in err


def _timeline(outcome: str, total: Any) -> dict[str, Any]:
    return {"outcome": outcome, "durations_s": {} if total is None else {"total": total}}


@pytest.mark.parametrize(
    ("timelines", "expected"),
    [
        pytest.param([], None, id="never-activated"),
        pytest.param([_timeline("ready", 12.0)], 12.0, id="one"),
        pytest.param([_timeline("ready", t) for t in (30.0, 10.0, 20.0)], 20.0, id="median"),
        pytest.param(
            [_timeline("failed", 99.0), _timeline("revived", 0.1), _timeline("ready", 8.0)],
            8.0,
            id="only-loads-count",
        ),
        pytest.param([_timeline("ready", None), _timeline("woken", 1.0)], None, id="no-total"),
    ],
)
def test_median_load_s(timelines, expected):
    assert median_load_s(timelines) == expected
