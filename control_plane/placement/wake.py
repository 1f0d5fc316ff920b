"""Sleeping replicas: waking one for a placement, or unloading one that is not to be woken.

A sleeping replica (put to sleep by ``control_plane.placement.retire``) keeps its weights on
its worker: waking it needs no fetch and no engine build, so placing a model wakes one of its
current generation first. One of an older generation, or on a worker that is gone, is
unloaded instead. Whoever removes a sleeping record from the store owns the replica, so a wake
and an unload of the same one never both go ahead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from control_plane.errors import WorkerCallError
from control_plane.placement.retire import FindWorker
from control_plane.store.base import StateStore
from foundation.records import ModelRecord, WorkerRecord

__all__ = ["SleeperApi", "Sleepers", "Woken"]

logger = logging.getLogger(__name__)


class SleeperApi(Protocol):
    """What waking and unloading sleepers needs of the workers' HTTP API."""

    async def wake(self, worker: WorkerRecord, model: str) -> None: ...

    async def unload(self, worker: WorkerRecord, model: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Woken:
    """A replica that was asleep and is awake now (its placement is not published yet)."""

    worker: WorkerRecord
    started_at: float
    """Monotonic seconds when the wake was asked for."""
    woken_at: float
    """Monotonic seconds when the worker answered it."""


class Sleepers:
    """Wakes sleeping replicas and unloads the ones not to be woken, each unload in a task
    that loads of the same model wait for.

    Parameters:
        store: the sleeping replicas' records; removing one claims the replica.
        workers: the wake and unload calls to workers.
        find_worker: the backend's record of a worker, by id.
        clock: monotonic seconds (how long a wake took).
    """

    def __init__(
        self,
        store: StateStore,
        workers: SleeperApi,
        find_worker: FindWorker,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._workers = workers
        self._find_worker = find_worker
        self._clock = clock
        self._unloads: dict[tuple[str, str], asyncio.Task[None]] = {}
        """(model, worker id) -> the unload of a replica that was asleep."""
        self._soon: set[asyncio.Task[None]] = set()

    async def wake(self, model: ModelRecord) -> Woken | None:
        """Wake a sleeping replica of ``model``, if one is left of its current generation;
        the caller publishes its placement. Stale sleepers met on the way are unloaded."""
        for sleeper in await self._store.list_sleeping(model.name):
            worker = self._find_worker(sleeper.worker_id)
            if sleeper.generation != model.generation or worker is None:
                self._unload_soon(sleeper.model, sleeper.worker_id)
                continue
            # Removing the record claims the replica: a concurrent unload loses.
            if not await self._store.remove_sleeping(model.name, worker.id):
                continue
            started = self._clock()
            try:
                await self._workers.wake(worker, model.name)
            except WorkerCallError as exc:
                logger.warning("waking %s on %s failed: %s", model.name, worker.id, exc.message)
                self._track_unload(model.name, worker)
                continue
            return Woken(worker=worker, started_at=started, woken_at=self._clock())
        return None

    async def unload(self, model: str, worker_id: str) -> None:
        """Unload a sleeping replica (idle past its timeout, evicted, or stale); does nothing
        when it is not asleep any more (woken, or unloaded by someone else)."""
        key = (model, worker_id)
        running = self._unloads.get(key)
        if running is None:
            if not await self._store.remove_sleeping(model, worker_id):
                return
            worker = self._find_worker(worker_id)
            if worker is None:
                return
            running = self._track_unload(model, worker)
        await asyncio.wait([running])

    def unloading(self) -> frozenset[tuple[str, str]]:
        """(model, worker id) of every sleeper being unloaded."""
        return frozenset(self._unloads)

    def is_on(self, worker_id: str) -> bool:
        """A sleeper is being unloaded from the worker."""
        return any(w == worker_id for (_, w) in self._unloads)

    def tasks_of(self, model: str) -> list[asyncio.Task[None]]:
        """The unloads of ``model``'s sleepers under way (a load of it waits for them)."""
        return [t for (m, _), t in self._unloads.items() if m == model]

    def tasks(self) -> list[asyncio.Task[None]]:
        """Every background task, for the placer to cancel when it closes."""
        return [*self._soon, *self._unloads.values()]

    def _unload_soon(self, model: str, worker_id: str) -> None:
        task = asyncio.create_task(self.unload(model, worker_id), name=f"unload-sleeping-{model}")
        self._soon.add(task)
        task.add_done_callback(self._soon.discard)

    def _track_unload(self, model: str, worker: WorkerRecord) -> asyncio.Task[None]:
        """Unload ``model`` from ``worker`` (already claimed from the store) in a task that
        loads of the model wait for."""
        key = (model, worker.id)

        async def unload() -> None:
            try:
                await self._workers.unload(worker, model)
                logger.info("unloaded sleeping %s from %s", model, worker.id)
            except WorkerCallError as exc:
                logger.warning("unloading sleeping %s from %s: %s", model, worker.id, exc.message)
            finally:
                self._unloads.pop(key, None)

        task = asyncio.create_task(unload(), name=f"unload-sleeping-{model}-{worker.id}")
        self._unloads[key] = task
        return task
