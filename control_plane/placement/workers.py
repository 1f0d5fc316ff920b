"""The pool's workers as the placer keeps them, beyond what the backend and the store hold.

Room is reserved on a worker for each load under way, from the moment the worker is chosen
(or, for a worker started for the load, from the moment it exists) until the placement is
published or the load fails; a worker with a reservation is not idle. Worker starts under way
count towards ``max_workers`` like the workers themselves. A worker that loaded a model
before is where that model goes again first (its node cache and engine cache hold it).
"""

from __future__ import annotations

import asyncio

from control_plane.backends.base import PodBackend, PoolSpec
from control_plane.store.base import StateStore
from foundation.records import WorkerRecord

__all__ = ["PoolWorkers"]


class PoolWorkers:
    """Starts and stops the pool's workers, and keeps the room reserved on them.

    Parameters:
        store: started workers are published here, stopped ones removed.
        backend: starts, lists and stops the workers.
        pool: the pool's name and size.
    """

    def __init__(self, store: StateStore, backend: PodBackend, pool: PoolSpec) -> None:
        self._store = store
        self._backend = backend
        self._pool = pool
        self._reserved: dict[str, dict[str, int]] = {}
        """worker id -> model -> bytes reserved for a load in progress."""
        self._starts: set[asyncio.Task[WorkerRecord]] = set()
        self._stopping: set[str] = set()
        self._history: dict[str, set[str]] = {}
        """worker id -> models it has loaded before (its caches are warm for them)."""

    # ---- what the backend lists ----

    def find(self, worker_id: str) -> WorkerRecord | None:
        """The worker with this id, if the backend still has it."""
        return next((w for w in self._backend.list_workers() if w.id == worker_id), None)

    def listed(self) -> tuple[WorkerRecord, ...]:
        """The pool's workers, in any state."""
        return tuple(self._backend.list_workers(self._pool.name))

    def count(self) -> int:
        """The pool's workers and the starts under way."""
        return len(self._backend.list_workers(self._pool.name)) + len(self._starts)

    # ---- starting and stopping ----

    def start(self, *, reserve: tuple[str, int] | None = None) -> asyncio.Task[WorkerRecord]:
        """Start a worker and publish it, in a task; with ``reserve`` (model, bytes), room
        for that model is reserved on the worker as soon as it exists."""
        task = asyncio.create_task(self._start(reserve), name=f"start-worker-{self._pool.name}")
        self._starts.add(task)
        task.add_done_callback(self._starts.discard)
        return task

    def starts(self) -> set[asyncio.Task[WorkerRecord]]:
        """The starts under way."""
        return set(self._starts)

    def release_when_started(self, task: asyncio.Task[WorkerRecord], model: str) -> None:
        """Drop the room ``task``'s start reserved for ``model`` once the worker is up (its
        placer stopped waiting for it)."""

        def release(done: asyncio.Task[WorkerRecord]) -> None:
            if not done.cancelled() and done.exception() is None:
                self.release(done.result().id, model)

        task.add_done_callback(release)

    def claim_stop(self, worker_id: str) -> bool:
        """Mark the worker as being stopped; False when it is already."""
        if worker_id in self._stopping:
            return False
        self._stopping.add(worker_id)
        return True

    async def stop(self, worker_id: str) -> None:
        """Stop a worker claimed with :meth:`claim_stop`: remove it from the store, then stop
        it, and forget what it loaded."""
        try:
            await self._store.remove_worker(worker_id)
            await self._backend.stop_worker(worker_id)
        finally:
            self._stopping.discard(worker_id)
            self._history.pop(worker_id, None)

    def stopping(self) -> frozenset[str]:
        """Ids of the workers being stopped."""
        return frozenset(self._stopping)

    # ---- reservations and history ----

    def reserve(self, worker_id: str, model: str, need: int) -> None:
        self._reserved.setdefault(worker_id, {})[model] = need

    def release(self, worker_id: str, model: str) -> None:
        reserved = self._reserved.get(worker_id)
        if reserved is not None:
            reserved.pop(model, None)
            if not reserved:
                del self._reserved[worker_id]

    def is_reserved(self, worker_id: str) -> bool:
        """A load is under way on the worker."""
        return worker_id in self._reserved

    def reserved(self) -> dict[str, dict[str, int]]:
        """A copy of worker id -> model -> bytes reserved."""
        return {w: dict(loads) for w, loads in self._reserved.items()}

    def loaded(self, worker_id: str, model: str) -> None:
        """The worker loaded ``model``: its caches are warm for it now."""
        self._history.setdefault(worker_id, set()).add(model)

    def forget(self, worker_id: str) -> None:
        """The worker is gone: forget what it loaded."""
        self._history.pop(worker_id, None)

    def warm(self) -> dict[str, frozenset[str]]:
        """Worker id -> the models it has loaded before."""
        return {w: frozenset(names) for w, names in self._history.items()}

    async def _start(self, reserve: tuple[str, int] | None) -> WorkerRecord:
        worker = await self._backend.start_worker(self._pool.name)
        if reserve is not None:
            # Reserved before any await: the reaper must not find the new worker idle.
            self.reserve(worker.id, *reserve)
        try:
            await self._store.put_worker(worker)
        except BaseException:
            if reserve is not None:
                self.release(worker.id, reserve[0])
            raise
        return worker
