"""Two pools behind one placer: models go to their backend's pool, replicas are taken away by
their worker's pool (the backend and the worker API are the recording fakes)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from control_plane.errors import NoCapacityError
from control_plane.placement import PoolPlacers
from control_plane.settings import PoolSettings
from control_plane.store.memory import MemoryStateStore
from foundation.records import ModelRecord, ResourceSpec, TrafficReport
from tests.control_plane.fakes import FakeBackend, FakeWorkers, make_settings

pytestmark = pytest.mark.anyio

VLLM_POOL = PoolSettings(
    name="vllm", backends=("vllm",), device="cuda", memory_bytes=1000, max_workers=2
)


class Setup:
    def __init__(self, **overrides: Any) -> None:
        self.settings = make_settings(
            pool="gpu", worker_device="cuda", extra_pools=(VLLM_POOL,), **overrides
        )
        self.store = MemoryStateStore()
        self.backend = FakeBackend()
        self.workers = FakeWorkers()
        self.placer = PoolPlacers(self.store, self.backend, self.workers, self.settings)

    async def __aenter__(self) -> Setup:
        await self.placer.ensure_pools()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.placer.close()
        await self.store.close()

    async def register(self, name: str, **kwargs: Any) -> ModelRecord:
        record = ModelRecord(
            name=name,
            storage_uri=f"/models/{name}",
            resources=kwargs.pop("resources", ResourceSpec("cuda")),
            **kwargs,
        )
        await self.store.create_model(record)
        return record

    def pool_of(self, worker_id: str) -> str:
        return self.backend.workers[worker_id].pool


async def test_each_pool_is_created_with_its_own_spec():
    async with Setup(max_workers=3) as s:
        gpu, vllm = s.backend.pools["gpu"], s.backend.pools["vllm"]
        assert (gpu.device, gpu.max_workers) == ("cuda", 3)
        assert (vllm.device, vllm.memory_bytes, vllm.max_workers) == ("cuda", 1000, 2)


async def test_a_model_lands_on_its_backends_pool():
    async with Setup() as s:
        llm = await s.placer.place(await s.register("llm", backend="vllm"))
        onnx = await s.placer.place(await s.register("onnx", backend="onnxruntime"))
        hf = await s.placer.place(await s.register("hf", config={"backend": "vllm"}))
        assert s.pool_of(llm.worker.id) == "vllm"
        assert s.pool_of(onnx.worker.id) == "gpu"
        assert hf.worker.id == llm.worker.id  # packed onto the vllm pool's worker
        assert s.workers.loads() == [
            (llm.worker.id, "llm"),
            (onnx.worker.id, "onnx"),
            (llm.worker.id, "hf"),
        ]


async def test_a_full_pool_does_not_spill_into_another():
    async with Setup() as s:
        full = ResourceSpec("cuda", 1000)  # a whole vllm worker
        now = time.time()
        for name in ("a", "b"):
            await s.placer.place(await s.register(name, backend="vllm", resources=full))
            # Busy, so not evicted for the next one.
            await s.store.report_traffic(TrafficReport(name, "a1", 1, now, now))
        with pytest.raises(NoCapacityError, match="max_workers=2"):
            await s.placer.place(await s.register("c", backend="vllm", resources=full))
        assert [w.pool for w in s.backend.list_workers()] == ["vllm", "vllm"]


async def test_replicas_are_taken_away_by_their_workers_pool():
    async with Setup() as s:
        llm = await s.placer.place(await s.register("llm", backend="vllm"))
        onnx = await s.placer.place(await s.register("onnx"))
        placements = await s.store.list_placements()
        assert not s.placer.is_idle(llm.worker.id, placements)
        assert not s.placer.is_idle(onnx.worker.id, placements)
        await s.placer.retire("llm", llm.worker.id, reason="idle")
        await s.placer.retire("onnx", onnx.worker.id, reason="idle")
        assert sorted(s.workers.unloads()) == sorted(
            [(llm.worker.id, "llm"), (onnx.worker.id, "onnx")]
        )
        assert await s.store.list_placements() == []
        for worker in (llm.worker, onnx.worker):
            assert s.placer.is_idle(worker.id, [])
            assert await s.placer.stop_worker_if_idle(worker.id)
        assert s.backend.list_workers() == []


async def test_a_model_moved_to_another_backend_leaves_its_old_pool():
    async with Setup() as s:
        record = await s.register("m", backend="onnxruntime")
        old = await s.placer.place(record)
        moved = dataclasses.replace(record, backend="vllm", generation=2)
        await s.store.update_model(moved)
        await s.placer.reload(moved)
        # Not reloaded with vllm on the gpu pool's worker: retired, and placed anew on its pool.
        assert s.workers.loads() == [(old.worker.id, "m")]
        assert s.workers.unloads() == [(old.worker.id, "m")]
        new = await s.placer.place(moved)
        assert s.pool_of(new.worker.id) == "vllm"
