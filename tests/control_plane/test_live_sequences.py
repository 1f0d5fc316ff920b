"""Idle unload and scale-down never cut a live sequence: a replica whose worker reports live
sequences of its model stays until they end, for the reasons that take a replica away for
want of work; other reasons (deleted, an operator's unload) take it anyway. And the worker's
answer itself: a real data plane counting its sequences, read by ``WorkerClient``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from control_plane.errors import WorkerCallError
from control_plane.worker_client import WorkerClient
from data_plane.app import build_node_cache, build_repository, create_app, load_startup_models
from data_plane.metrics import Metrics
from data_plane.settings import DataPlaneSettings, ModelControlMode
from foundation.records import WorkerRecord
from tests.control_plane.test_reaper import IDLE_S, Setup
from tests.data_plane.sequence.models import write_onnx_accumulator

pytestmark = pytest.mark.anyio


async def test_an_idle_model_with_live_sequences_stays_until_they_end() -> None:
    async with Setup() as s:
        await s.place("m")
        await s.traffic("m", 0)
        s.workers.live[("w1", "m")] = 2
        s.wall.advance(IDLE_S + 1)
        await s.sweep()
        await s.sweep()
        assert await s.placed() == {"m"}
        assert s.workers.unloads() == []
        s.workers.live[("w1", "m")] = 0
        await s.sweep()
        assert await s.placed() == set()
        assert s.workers.unloads() == [("w1", "m")]


@pytest.mark.parametrize(
    ("reason", "is_kept"),
    [
        pytest.param("scale_down", True, id="scale-down-waits"),
        pytest.param("idle", True, id="idle-waits"),
        pytest.param("deleted", False, id="deleted-goes"),
        pytest.param("admin", False, id="operator-unload-goes"),
    ],
)
async def test_which_reasons_wait_for_live_sequences(reason: str, is_kept: bool) -> None:
    async with Setup() as s:
        await s.place("m")
        s.workers.live[("w1", "m")] = 1
        await s.placer.retire("m", "w1", reason=reason)
        assert (await s.placed() == {"m"}) is is_kept


async def test_a_worker_that_cannot_be_asked_is_retired() -> None:
    async with Setup() as s:
        await s.place("m")
        s.workers.live[("w1", "m")] = 1
        s.workers.silent_sequences.add("w1")
        await s.placer.retire("m", "w1", reason="idle")
        assert await s.placed() == set()


@contextlib.asynccontextmanager
async def worker_app(tmp_path: Path) -> AsyncIterator[httpx.AsyncBaseTransport]:
    """A data plane serving an ONNX accumulator, as an ASGI transport for httpx."""
    repo = tmp_path / "repo"
    write_onnx_accumulator(repo, "acc")
    settings = DataPlaneSettings(
        model_repository=str(repo),
        model_control_mode=ModelControlMode.EXPLICIT,
        load_models=("acc",),
        cache_dir=tmp_path / "cache",
        gpu_count=0,
        exit_timeout_s=5.0,
    )
    metrics = Metrics()
    cache = build_node_cache(settings, metrics)
    repository = build_repository(settings, metrics, cache, gpu_count=0)
    app = create_app(settings, repository, cache, metrics)
    async with app.router.lifespan_context(app) as state:
        await load_startup_models(settings, repository)

        async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
            scope["state"] = dict(state or {})
            await app(scope, receive, send)

        yield httpx.ASGITransport(app=with_state)


async def test_the_worker_counts_its_live_sequences(tmp_path: Path) -> None:
    worker = WorkerRecord(id="w1", url="http://worker")
    async with worker_app(tmp_path) as transport:
        client = WorkerClient(load_timeout_s=30.0, unload_timeout_s=30.0, transport=transport)
        data = httpx.AsyncClient(transport=transport, base_url=worker.url)
        try:

            async def step(cid: int, **flags: Any) -> None:
                row = {"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}
                body = {"inputs": [row], "parameters": {"sequence_id": cid, **flags}}
                response = await data.post("/v2/models/acc/infer", json=body)
                assert response.status_code == 200, response.text

            assert await client.live_sequences(worker, "acc") == 0
            await step(1, sequence_start=True)
            await step(2, sequence_start=True)
            assert await client.live_sequences(worker, "acc") == 2
            await step(1, sequence_end=True)
            assert await client.live_sequences(worker, "acc") == 1
            assert await client.live_sequences(worker, "not-loaded") == 0
            answer = await data.get("/v2/repository/models/acc/sequences")
            assert answer.json() == {"name": "acc", "live": 1}
        finally:
            await data.aclose()
            await client.close()


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        pytest.param(200, {"name": "m", "live": 3}, 3, id="answer"),
        pytest.param(404, {"error": "Not Found"}, 0, id="older-worker-without-the-call"),
        pytest.param(200, {"live": -1}, None, id="negative"),
        pytest.param(200, {"live": True}, None, id="bool"),
        pytest.param(200, ["live"], None, id="not-an-object"),
        pytest.param(500, {"error": "boom"}, None, id="server-error"),
    ],
)
async def test_worker_client_reads_the_answer(
    status: int, body: object, expected: int | None
) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, json=body))
    client = WorkerClient(load_timeout_s=1.0, unload_timeout_s=1.0, transport=transport)
    worker = WorkerRecord(id="w1", url="http://worker")
    try:
        if expected is None:
            with pytest.raises(WorkerCallError):
                await client.live_sequences(worker, "m")
        else:
            assert await client.live_sequences(worker, "m") == expected
    finally:
        await client.close()
