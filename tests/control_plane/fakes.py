"""Fakes for control-plane unit tests: a recording backend and worker API, and a way to run
an ASGI app's lifespan around in-process requests (the clock is ``tests.fakes.FakeClock``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane.backends.base import PodBackend, PoolSpec
from control_plane.errors import LoadFailedError, NoCapacityError, WorkerCallError
from control_plane.settings import ControlPlaneSettings
from control_plane.worker_client import LoadReport
from foundation.records import ModelRecord, WorkerRecord, WorkerState


def make_settings(tmp_path: Path | None = None, **overrides: Any) -> ControlPlaneSettings:
    """Settings for tests: no propagation pause, short drains, a token."""
    values: dict[str, Any] = {
        "admin_token": "test-admin-token",
        "placement_propagation_s": 0.0,
        "drain_timeout_s": 1.0,
        "pool_grace_period_s": 10.0,
        "activation_timeout_s": 30.0,
        "cache_dir": tmp_path or Path("/nonexistent/zeroserve-test-cache"),
        "allowed_storage": ("/models", "s3://bucket"),
    }
    values.update(overrides)
    return ControlPlaneSettings(**values)


class Acting:
    """``is_acting`` that tests flip."""

    def __init__(self, is_acting: bool = True) -> None:
        self.is_acting = is_acting


class FakeBackend(PodBackend):
    """Workers that exist as records only; starts and stops are recorded."""

    def __init__(self) -> None:
        self.pools: dict[str, PoolSpec] = {}
        self.workers: dict[str, WorkerRecord] = {}
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.start_gate: asyncio.Event | None = None
        self.urls: list[str] = []
        """URLs the next workers started get, in order (then made-up ones)."""
        self._count = 0

    async def ensure_pool(self, pool: PoolSpec) -> None:
        self.pools[pool.name] = pool

    async def start_worker(self, pool: str) -> WorkerRecord:
        spec = self.pools[pool]
        if len(self.list_workers(pool)) >= spec.max_workers:
            raise NoCapacityError(model="*", reason="pool full")
        self._count += 1
        worker = WorkerRecord(
            id=f"w{self._count}",
            url=self.urls.pop(0) if self.urls else f"http://worker-{self._count}",
            pool=pool,
            device=spec.device,
            memory_bytes=spec.memory_bytes,
            state=WorkerState.READY,
            started_at=float(self._count),
        )
        if self.start_gate is not None:
            await self.start_gate.wait()
        self.workers[worker.id] = worker
        self.started.append(worker.id)
        return worker

    async def stop_worker(self, worker_id: str) -> None:
        if self.workers.pop(worker_id, None) is not None:
            self.stopped.append(worker_id)

    async def delete_pool(self, pool: str) -> None:
        for worker in self.list_workers(pool):
            await self.stop_worker(worker.id)

    def list_workers(self, pool: str | None = None) -> list[WorkerRecord]:
        return [w for w in self.workers.values() if pool is None or w.pool == pool]

    async def health(self, worker_id: str) -> bool:
        return worker_id in self.workers

    def details(self, worker_id: str) -> dict[str, object]:
        return {"fake": True} if worker_id in self.workers else {}

    async def close(self) -> None:
        self.workers.clear()

    def kill(self, worker_id: str) -> None:
        """The worker vanishes (crash)."""
        self.workers.pop(worker_id, None)


@dataclasses.dataclass
class FakeWorkers:
    """The worker HTTP API, recorded: ``events`` holds ("load"|"unload"|"sleep"|"wake",
    worker, model)."""

    events: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    fail_loads: dict[str, str] = dataclasses.field(default_factory=dict)
    """model -> the worker's error message (a failure that may pass: a 503)."""
    refuse_loads: dict[str, str] = dataclasses.field(default_factory=dict)
    """model -> the worker's error message for a load that fails for good (a 400)."""
    attempts: list[str] = dataclasses.field(default_factory=list)
    """Every model a load was asked for, failed loads included."""
    die_on_load: set[str] = dataclasses.field(default_factory=set)
    """worker ids whose next load fails as if the worker died."""
    load_gate: asyncio.Event | None = None
    cache: str = "hit"
    cannot_sleep: set[str] = dataclasses.field(default_factory=set)
    """models whose runtime cannot sleep (the worker answers 501)."""
    fail_wakes: set[str] = dataclasses.field(default_factory=set)
    """worker ids whose wakes fail as if the worker died."""
    live: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    """(worker id, model) -> the sequences the worker reports running."""
    silent_sequences: set[str] = dataclasses.field(default_factory=set)
    """worker ids that cannot be asked for live sequences (the call fails)."""
    fetching: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """model -> (bytes fetched, bytes needed) the worker reports for a load under way."""

    async def load(self, worker: WorkerRecord, model: ModelRecord) -> LoadReport:
        if self.load_gate is not None:
            await self.load_gate.wait()
        self.attempts.append(model.name)
        if worker.id in self.die_on_load:
            self.die_on_load.discard(worker.id)
            raise WorkerCallError(worker=worker.id, reason="connection reset")
        if model.name in self.refuse_loads:
            message = self.refuse_loads[model.name]
            raise LoadFailedError(
                model=model.name,
                worker=worker.id,
                reason=f"400: {message}",
                is_permanent=True,
                worker_message=message,
            )
        if model.name in self.fail_loads:
            raise LoadFailedError(
                model=model.name, worker=worker.id, reason=self.fail_loads[model.name]
            )
        self.events.append(("load", worker.id, model.name))
        return LoadReport(duration_s=0.01, cache=self.cache, bytes_fetched=0, fetch_s=0.0)

    async def unload(self, worker: WorkerRecord, model: str) -> None:
        self.events.append(("unload", worker.id, model))

    async def sleep(self, worker: WorkerRecord, model: str) -> None:
        if model in self.cannot_sleep:
            raise LoadFailedError(model=model, worker=worker.id, reason="501: cannot sleep")
        self.events.append(("sleep", worker.id, model))

    async def wake(self, worker: WorkerRecord, model: str) -> None:
        if worker.id in self.fail_wakes:
            raise WorkerCallError(worker=worker.id, reason="connection reset")
        self.events.append(("wake", worker.id, model))

    async def fetch_progress(self, worker: WorkerRecord, model: str) -> tuple[int, int] | None:
        return self.fetching.get(model)

    async def live_sequences(self, worker: WorkerRecord, model: str) -> int:
        if worker.id in self.silent_sequences:
            raise WorkerCallError(worker=worker.id, reason="connection reset")
        return self.live.get((worker.id, model), 0)

    def loads(self) -> list[tuple[str, str]]:
        return [(w, m) for kind, w, m in self.events if kind == "load"]

    def unloads(self) -> list[tuple[str, str]]:
        return [(w, m) for kind, w, m in self.events if kind == "unload"]


@contextlib.asynccontextmanager
async def lifespan(app: ASGIApp) -> AsyncIterator[ASGIApp]:
    """Run ``app``'s lifespan and yield an app that sees its state, as a server would.

    ``httpx.ASGITransport`` runs no lifespan, so requests would not see the state.
    """
    state: dict[str, Any] = {}
    to_app: asyncio.Queue[Message] = asyncio.Queue()
    from_app: asyncio.Queue[Message] = asyncio.Queue()

    async def receive() -> Message:
        return await to_app.get()

    async def send(message: Message) -> None:
        await from_app.put(message)

    async def run() -> None:
        await app({"type": "lifespan", "state": state}, receive, send)

    task = asyncio.create_task(run())
    await to_app.put({"type": "lifespan.startup"})
    started = await asyncio.wait_for(from_app.get(), 10)
    assert started["type"] == "lifespan.startup.complete", started

    async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
        await app({**scope, "state": dict(state)}, receive, send)

    try:
        yield with_state
    finally:
        await to_app.put({"type": "lifespan.shutdown"})
        stopped = await asyncio.wait_for(from_app.get(), 10)
        assert stopped["type"] == "lifespan.shutdown.complete", stopped
        await task


def wall_now() -> float:
    return time.time()
