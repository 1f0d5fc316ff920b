"""Where replicas go: choose a worker with room, load the model there, take replicas away.

Choosing and reserving happen under one lock, so two activations never book the same room;
starting workers, loading and unloading happen outside it, with the room reserved. The
choice itself is ``control_plane.placement.choose``, a pure function of a snapshot of the
pool read just before it: a worker with room (preferring one that loaded the model before,
then the fullest), else a new worker if the pool may grow, else an eviction of a sleeping
or least recently used idle replica, else ``NoCapacityError``.

Taking replicas away (retiring them, putting them to sleep) is ``retire``; waking a sleeping
replica and unloading sleepers is ``wake``; the placer tries both before choosing: a replica
still in its retirement's propagation pause is revived in place, then a sleeping one of the
model is woken (no fetch, no engine build), and only then is a worker chosen. A sleeping
replica counts against its worker's room like a loaded one, and is the first to go when room
is needed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from control_plane.backends.base import PodBackend, PoolSpec
from control_plane.errors import NoCapacityError, WorkerCallError
from control_plane.placement.choose import (
    Decision,
    Evict,
    NoCapacity,
    Place,
    PoolView,
    StartWorker,
    Traffic,
    WaitForStarts,
    choose,
    traffic_needed,
)
from control_plane.placement.retire import Retirements
from control_plane.placement.units import UnitWorkers, parts_of, unit_record, unit_records
from control_plane.placement.wake import Sleepers
from control_plane.placement.workers import PoolWorkers
from control_plane.settings import ControlPlaneSettings
from control_plane.store.base import StateStore
from control_plane.worker_client import LoadReport
from foundation.records import ModelRecord, Placement, WorkerRecord

__all__ = ["PlaceProgress", "PlaceResult", "Placer", "WorkerApi"]

logger = logging.getLogger(__name__)

_PLACE_ATTEMPTS = 3
_FETCH_POLL_S = 1.0
"""How often a worker is asked how far its download has come during a load."""


class WorkerApi(Protocol):
    """Loads and unloads on one worker, and asks it for live sequences and how far a
    download has come (``control_plane.worker_client.WorkerClient``)."""

    async def load(self, worker: WorkerRecord, model: ModelRecord) -> LoadReport: ...

    async def unload(self, worker: WorkerRecord, model: str) -> None: ...

    async def sleep(self, worker: WorkerRecord, model: str) -> None: ...

    async def wake(self, worker: WorkerRecord, model: str) -> None: ...

    async def live_sequences(self, worker: WorkerRecord, model: str) -> int: ...

    async def fetch_progress(self, worker: WorkerRecord, model: str) -> tuple[int, int] | None: ...


class PlaceProgress(Protocol):
    """Told of each step of one placement as it begins, for the live activation timeline:
    ``worker_starting`` (a worker is being started for it) and ``loading`` (the load call
    goes to ``worker_id``); during the load, told again of ``loading`` with ``fetched``
    (bytes downloaded, bytes needed) each time the worker's download has moved. Must not
    raise; awaited inline, so it should be quick."""

    async def __call__(
        self,
        phase: str,
        worker_id: str | None = None,
        *,
        fetched: tuple[int, int] | None = None,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class PlaceResult:
    """A new replica and how it came about (for the activation timeline)."""

    placement: Placement
    worker: WorkerRecord
    is_worker_started: bool
    """A worker was started for this replica (else an existing one was used)."""
    is_revived: bool
    """The replica was being retired and was put back without a load."""
    worker_ready_at: float
    """``time.monotonic()`` when the worker was chosen and ready."""
    loaded_at: float
    """``time.monotonic()`` when the worker answered the load."""
    load: LoadReport | None
    evicted: tuple[str, ...] = ()
    """Models whose replicas were evicted to make room."""
    is_woken: bool = False
    """A sleeping replica was woken (``loaded_at`` is when the wake ended)."""


class Placer:
    """Places replicas of models on workers of one pool, and retires them.

    Parameters:
        store: placements and workers are published here.
        backend: starts and stops the pool's workers.
        pool: the pool replicas go to (its device and size).
        workers: the HTTP calls to workers.
        settings: pool, budgets and timeouts.
        clock: monotonic seconds (injected for tests).
        wall: wall-clock seconds since the epoch (placement timestamps).
    """

    def __init__(
        self,
        store: StateStore,
        backend: PodBackend,
        pool: PoolSpec,
        workers: WorkerApi,
        settings: ControlPlaneSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._pool = pool
        self._workers = workers
        self._settings = settings
        self._clock = clock
        self._wall = wall
        self._lock = asyncio.Lock()
        self._pool_workers = PoolWorkers(store, backend, pool)
        # Ensembles are placed with their parts; retiring one unloads them with it.
        self._unit_workers = UnitWorkers(workers, store)
        self._retirements = Retirements(
            store,
            self._unit_workers,
            self._pool_workers.find,
            propagation_s=settings.placement_propagation_s,
            drain_timeout_s=settings.drain_timeout_s,
            clock=clock,
            wall=wall,
            sequences=workers,
            host_memory_bytes=settings.worker_host_memory_bytes,
        )
        self._sleepers = Sleepers(store, workers, self._pool_workers.find, clock=clock)

    # ---- placing ----

    async def place(
        self,
        model: ModelRecord,
        *,
        may_evict: bool = True,
        progress: PlaceProgress | None = None,
    ) -> PlaceResult:
        """Add one replica of ``model`` on a worker that does not hold it yet; with
        ``may_evict`` False only where there is room without evicting a replica; ``progress``
        is told of each step as it begins.

        Raises ``NoCapacityError`` when no worker can take it, ``WorkerStartError`` when a
        needed worker does not start, ``LoadFailedError`` when the worker refuses the model,
        and ``WorkerCallError`` when workers keep dying under the load.
        """
        revived = await self._revive(model)
        if revived is not None:
            return revived
        # A sleep under way ends with a sleeping replica to wake: let it finish first.
        await self._await_unloads(model.name)
        woken = await self._wake(model)
        if woken is not None:
            return woken
        last: WorkerCallError | None = None
        for _ in range(_PLACE_ATTEMPTS):
            try:
                return await self._place_once(model, progress, may_evict=may_evict)
            except WorkerCallError as exc:
                if type(exc) is not WorkerCallError:
                    raise  # the worker answered: a refused load is not retried
                # The worker went away mid-load (crash, kill): try another one.
                logger.warning("placing %s failed, retrying: %s", model.name, exc.message)
                last = exc
        assert last is not None
        raise last

    async def _place_once(
        self, model: ModelRecord, progress: PlaceProgress | None, *, may_evict: bool
    ) -> PlaceResult:
        worker, decision = await self._claim_room(model, progress)
        is_started = isinstance(decision, StartWorker)
        evicted: tuple[str, ...] = ()
        try:
            if isinstance(decision, Evict) and not may_evict:
                raise NoCapacityError(
                    model=model.name, reason=f"only by evicting '{decision.victim.model}'"
                )
            if isinstance(decision, Evict) and decision.is_sleeping:
                await self._sleepers.unload(decision.victim.model, decision.victim.worker_id)
                evicted = (decision.victim.model,)
            elif isinstance(decision, Evict):
                await self._retirements.retire(
                    decision.victim.model, decision.victim.worker_id, reason="evicted"
                )
                evicted = (decision.victim.model,)
            ready_at = self._clock()
            # A load of a model asleep on the worker wakes it there: it is not asleep after.
            await self._store.remove_sleeping(model.name, worker.id)
            watcher = None
            if progress is not None:
                await progress("loading", worker.id)
                watcher = asyncio.create_task(
                    self._watch_fetch(worker, model.name, progress), name=f"fetch-{model.name}"
                )
            try:
                report = await self._load_unit(worker, model)
            finally:
                if watcher is not None:
                    watcher.cancel()
                    await asyncio.gather(watcher, return_exceptions=True)
            loaded_at = self._clock()
            if self._pool_workers.find(worker.id) is None:
                raise WorkerCallError(
                    worker=worker.id, reason="the worker went away during the load"
                )
            placement = await self._publish(model, worker)
            self._pool_workers.loaded(worker.id, model.name)
        finally:
            self._pool_workers.release(worker.id, model.name)
        logger.info(
            "placed %s on %s (%s worker, load %.3f s, cache %s)",
            model.name,
            worker.id,
            "new" if is_started else "existing",
            report.duration_s,
            report.cache,
            extra={"model": model.name, "worker": worker.id},
        )
        return PlaceResult(
            placement=placement,
            worker=worker,
            is_worker_started=is_started,
            is_revived=False,
            worker_ready_at=ready_at,
            loaded_at=loaded_at,
            load=report,
            evicted=evicted,
        )

    async def _load_unit(self, worker: WorkerRecord, model: ModelRecord) -> LoadReport:
        """Load ``model`` on ``worker``, an ensemble's parts first (deepest first); when any
        load fails, the parts the worker does not otherwise need are unloaded again."""
        models = {m.name: m for m in await self._store.list_models()}
        parts = parts_of(model, models)
        if not parts:
            return await self._workers.load(worker, model)
        try:
            for part in parts:
                await self._workers.load(worker, part)
            return await self._workers.load(worker, model)
        except Exception:
            for part in reversed(parts):
                try:
                    await self._unit_workers.unload(worker, part.name)
                except WorkerCallError as exc:
                    logger.warning("unloading %s after a failed load: %s", part.name, exc)
            raise

    async def _watch_fetch(self, worker: WorkerRecord, model: str, progress: PlaceProgress) -> None:
        """Pass the worker's download progress of ``model`` on while it moves; runs until
        cancelled (when the load ends)."""
        last = None
        while True:
            await asyncio.sleep(_FETCH_POLL_S)
            fetched = await self._workers.fetch_progress(worker, model)
            if fetched is not None and fetched != last:
                last = fetched
                await progress("loading", worker.id, fetched=fetched)

    async def _claim_room(
        self, model: ModelRecord, progress: PlaceProgress | None = None
    ) -> tuple[WorkerRecord, Decision]:
        """Choose a worker for ``model`` (with its parts, for an ensemble) and reserve room
        there, under the lock; when the choice is a new worker, return once it has started
        (with the room reserved)."""
        while True:
            start: asyncio.Task[WorkerRecord] | None = None
            waiting: set[asyncio.Task[WorkerRecord]] = set()
            async with self._lock:
                view, unit = await self._view(model)
                need = unit.resources.memory_bytes
                decision = choose(view, unit)
                match decision:
                    case NoCapacity(reason=reason):
                        raise NoCapacityError(model=model.name, reason=reason)
                    case Place(worker=worker) | Evict(worker=worker):
                        self._pool_workers.reserve(worker.id, model.name, need)
                        return worker, decision
                    case StartWorker():
                        start = self._pool_workers.start(reserve=(model.name, need))
                    case WaitForStarts():
                        waiting = self._pool_workers.starts()
            if start is not None:
                if progress is not None:
                    await progress("worker_starting")
                try:
                    return await asyncio.shield(start), decision
                except asyncio.CancelledError:
                    # The start goes on without us; drop the room it reserved for us.
                    self._pool_workers.release_when_started(start, model.name)
                    raise
            # The pool is full of workers still starting: one of them may have room. (When
            # they ended while the traffic was read, the next choice sees their workers.)
            if waiting:
                await asyncio.wait(waiting)

    async def start_worker(self) -> WorkerRecord:
        """Start one worker of the pool and publish it; ``NoCapacityError`` at max_workers."""
        async with self._lock:
            if self._pool_workers.count() >= self._pool.max_workers:
                raise NoCapacityError(
                    model="*", reason=f"the pool is at max_workers={self._pool.max_workers}"
                )
            task = self._pool_workers.start()
        return await asyncio.shield(task)

    async def _view(self, model: ModelRecord) -> tuple[PoolView, ModelRecord]:
        """The pool as ``choose`` needs it to place ``model``, and ``model`` as it is placed
        (an ensemble with its parts' memory): every store read comes first, then the
        backend's workers and our bookkeeping, taken together with no await between them,
        then the traffic of the replicas it may evict. Raises NoCapacityError for an
        ensemble whose parts are not all registered."""
        placements = tuple(await self._store.list_placements())
        sleeping = tuple(await self._store.list_sleeping())
        registered = {m.name: m for m in await self._store.list_models()}
        unit = unit_record(model, registered)
        # A placed ensemble holds its parts' room too.
        models = unit_records(registered)
        view = PoolView(
            pool=self._pool,
            workers=self._pool_workers.listed(),
            starting=len(self._pool_workers.starts()),
            placements=placements,
            sleeping=sleeping,
            models=models,
            reserved=self._pool_workers.reserved(),
            retiring=self._retirements.pairs(),
            unloading=self._sleepers.unloading(),
            stopping=self._pool_workers.stopping(),
            warm=self._pool_workers.warm(),
            max_models_per_worker=self._settings.max_models_per_worker,
        )
        wanted = traffic_needed(view, unit)
        if not wanted:
            return view, unit
        traffic: dict[str, Traffic] = {}
        for name in sorted(wanted):
            reports = await self._store.traffic(name)
            traffic[name] = Traffic(
                in_flight=sum(r.in_flight for r in reports),
                last_request_at=max((r.last_request_at for r in reports), default=0.0),
            )
        return dataclasses.replace(view, traffic=traffic), unit

    async def reload(self, model: ModelRecord) -> None:
        """Load ``model``'s current generation in place on every worker that serves an older
        one of this pool; the worker keeps serving the old one until the new one is ready."""
        for placement in await self._store.list_placements(model.name):
            if placement.generation >= model.generation:
                continue
            worker = self._pool_workers.find(placement.worker_id)
            if worker is None or worker.pool != self._pool.name:
                continue
            await self._load_unit(worker, model)
            await self._store.add_placement(
                dataclasses.replace(placement, generation=model.generation, since=self._wall())
            )
            logger.info(
                "reloaded %s on %s (generation %d)", model.name, worker.id, model.generation
            )

    # ---- retiring and waking ----

    async def retire(self, model: str, worker_id: str, *, reason: str) -> None:
        """Take the replica of ``model`` on ``worker_id`` away, losing no request.

        Returns once the worker has unloaded it (or is gone). Joins a retirement already
        under way; does nothing when there is no such placement.
        """
        await self._retirements.retire(model, worker_id, reason=reason)

    async def sleep(self, model: str, worker_id: str) -> None:
        """Put the replica of ``model`` on ``worker_id`` to sleep, losing no request: as
        :meth:`retire`, but the worker's engine sleeps instead of unloading, and the store
        records the replica as sleeping. A worker that cannot sleep it unloads it."""
        await self._retirements.sleep(model, worker_id)

    def retire_soon(self, model: str, worker_id: str, *, reason: str) -> None:
        """Start retiring a replica without waiting for it."""
        self._retirements.retire_soon(model, worker_id, reason=reason)

    def is_retiring(self, model: str) -> bool:
        return self._retirements.is_retiring(model)

    async def unload_sleeping(self, model: str, worker_id: str) -> None:
        """Unload a sleeping replica (idle past its timeout, evicted, or stale); does nothing
        when it is not asleep any more (woken, or unloaded by someone else)."""
        await self._sleepers.unload(model, worker_id)

    async def _revive(self, model: ModelRecord) -> PlaceResult | None:
        """Put back a replica of ``model`` still in its propagation pause, if there is one."""
        worker = await self._retirements.revive(model)
        if worker is None:
            return None
        now = self._clock()
        placement = await self._publish(model, worker)
        logger.info("revived %s on %s", model.name, worker.id)
        return PlaceResult(
            placement=placement,
            worker=worker,
            is_worker_started=False,
            is_revived=True,
            worker_ready_at=now,
            loaded_at=now,
            load=None,
        )

    async def _wake(self, model: ModelRecord) -> PlaceResult | None:
        """Wake a sleeping replica of ``model``, if one is left of its current generation."""
        woken = await self._sleepers.wake(model)
        if woken is None:
            return None
        worker = woken.worker
        placement = await self._publish(model, worker)
        self._pool_workers.loaded(worker.id, model.name)
        logger.info(
            "woke %s on %s in %.3f s",
            model.name,
            worker.id,
            woken.woken_at - woken.started_at,
            extra={"model": model.name, "worker": worker.id},
        )
        return PlaceResult(
            placement=placement,
            worker=worker,
            is_worker_started=False,
            is_revived=False,
            worker_ready_at=woken.started_at,
            loaded_at=woken.woken_at,
            load=None,
            is_woken=True,
        )

    async def _await_unloads(self, model: str) -> None:
        """Let unloads of ``model`` finish: a load racing an unload on one worker loses."""
        tasks = [*self._retirements.tasks_of(model), *self._sleepers.tasks_of(model)]
        if tasks:
            await asyncio.wait(tasks)

    async def _publish(self, model: ModelRecord, worker: WorkerRecord) -> Placement:
        """Add the placement of ``model`` on ``worker`` (activators route to it from now)."""
        placement = Placement(
            model=model.name,
            worker_id=worker.id,
            url=worker.url,
            generation=model.generation,
            since=self._wall(),
            grpc_address=worker.grpc_address,
        )
        await self._store.add_placement(placement)
        return placement

    # ---- workers ----

    def is_idle(self, worker_id: str, placements: list[Placement]) -> bool:
        """No replica (``placements`` should hold sleeping ones too), load or unload on the
        worker."""
        return (
            not self._pool_workers.is_reserved(worker_id)
            and not self._retirements.is_on(worker_id)
            and not self._sleepers.is_on(worker_id)
            and not any(p.worker_id == worker_id for p in placements)
        )

    async def stop_worker_if_idle(self, worker_id: str) -> bool:
        """Stop the worker unless something was placed on it meanwhile; True if stopped."""
        async with self._lock:
            placements = await self._store.list_placements() + await self._store.list_sleeping()
            if not self.is_idle(worker_id, placements):
                return False
            if not self._pool_workers.claim_stop(worker_id):
                return False
        await self._pool_workers.stop(worker_id)
        return True

    async def forget_worker(self, worker_id: str) -> None:
        """A worker died: drop its placements (publishing REMOVED) and what we knew of it."""
        await self._store.remove_worker(worker_id)
        self._pool_workers.forget(worker_id)
        self._retirements.cancel_on(worker_id)

    async def close(self) -> None:
        """Cancel background retirements (the workers are stopped after this anyway)."""
        tasks: list[asyncio.Task[Any]] = [
            *self._retirements.tasks(),
            *self._pool_workers.starts(),
            *self._sleepers.tasks(),
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
