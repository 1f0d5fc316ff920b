"""Where replicas go: choose a worker with room, load the model there, take replicas away.

Choosing and reserving happen under one lock, so two activations never book the same room;
starting workers, loading and unloading happen outside it, with the room reserved. The
choice itself is ``control_plane.placement.choose``, a pure function of a snapshot of the
pool read just before it: a worker with room (preferring one that loaded the model before,
then the fullest), else a new worker if the pool may grow, else an eviction of a sleeping
or least recently used idle replica, else ``NoCapacityError``.

A replica is retired in the order that loses no request: the placement is removed first (new
requests take the activation path), activators are given ``placement_propagation_s`` to see
that, in-flight requests drain (bounded), and only then the worker unloads. A placement asked
for while its replica is still in the propagation pause is revived in place instead.

A replica of an LLM can be put to sleep the same way instead of unloaded (:meth:`Placer.sleep`):
after the drain the worker puts its engine to sleep and the store records the replica as
sleeping (activators never see those). Placing the model then wakes a sleeping replica first
(no fetch, no engine build); a sleeping replica counts against its worker's room like a
loaded one, and is the first to go when room is needed. Whoever removes a sleeping record from
the store owns the replica, so a wake and an unload of the same one never both go ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from control_plane.backends.base import PodBackend, PoolSpec
from control_plane.errors import NoCapacityError, UpstreamError
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
from control_plane.records import ModelRecord, Placement, WorkerRecord
from control_plane.settings import ControlPlaneSettings
from control_plane.store.base import StateStore
from control_plane.worker_client import LoadReport

__all__ = ["PlaceResult", "Placer", "WorkerApi"]

logger = logging.getLogger(__name__)

_DRAIN_POLL_S = 0.1
_PLACE_ATTEMPTS = 3


class WorkerApi(Protocol):
    """Loads and unloads on one worker (``control_plane.worker_client.WorkerClient``)."""

    async def load(self, worker: WorkerRecord, model: ModelRecord) -> LoadReport: ...

    async def unload(self, worker: WorkerRecord, model: str) -> None: ...

    async def sleep(self, worker: WorkerRecord, model: str) -> None: ...

    async def wake(self, worker: WorkerRecord, model: str) -> None: ...


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


class _Phase(enum.Enum):
    PROPAGATING = "propagating"
    DRAINING = "draining"
    UNLOADING = "unloading"


@dataclass
class _Retirement:
    model: str
    worker: WorkerRecord
    placement: Placement
    phase: _Phase = _Phase.PROPAGATING
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    to_sleep: bool = False
    """Put the replica to sleep instead of unloading it."""


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
        self._backend = backend
        self._pool = pool
        self._workers = workers
        self._settings = settings
        self._clock = clock
        self._wall = wall
        self._lock = asyncio.Lock()
        self._pending: dict[str, dict[str, int]] = {}
        """worker id -> model -> bytes reserved for a load in progress."""
        self._retiring: dict[tuple[str, str], _Retirement] = {}
        self._stopping: set[str] = set()
        self._history: dict[str, set[str]] = {}
        """worker id -> models it has loaded before (its caches are warm for them)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._starts: set[asyncio.Task[WorkerRecord]] = set()
        self._sleeper_unloads: dict[tuple[str, str], asyncio.Task[None]] = {}
        """(model, worker id) -> the unload of a replica that was asleep."""

    # ---- placing ----

    async def place(self, model: ModelRecord) -> PlaceResult:
        """Add one replica of ``model`` on a worker that does not hold it yet.

        Raises ``NoCapacityError`` when no worker can take it, ``WorkerStartError`` when a
        needed worker does not start, ``LoadFailedError`` when the worker refuses the model,
        and ``UpstreamError`` when workers keep dying under the load.
        """
        revived = await self._revive(model)
        if revived is not None:
            return revived
        # A sleep under way ends with a sleeping replica to wake: let it finish first.
        await self._await_unloads(model.name)
        woken = await self._wake(model)
        if woken is not None:
            return woken
        last: UpstreamError | None = None
        for _ in range(_PLACE_ATTEMPTS):
            try:
                return await self._place_once(model)
            except UpstreamError as exc:
                if type(exc) is not UpstreamError:
                    raise  # the worker answered: a refused load is not retried
                # The worker went away mid-load (crash, kill): try another one.
                logger.warning("placing %s failed, retrying: %s", model.name, exc.message)
                last = exc
        assert last is not None
        raise last

    async def _place_once(self, model: ModelRecord) -> PlaceResult:
        worker, decision = await self._claim_room(model)
        is_started = isinstance(decision, StartWorker)
        evicted: tuple[str, ...] = ()
        try:
            if isinstance(decision, Evict) and decision.is_sleeping:
                await self.unload_sleeping(decision.victim.model, decision.victim.worker_id)
                evicted = (decision.victim.model,)
            elif isinstance(decision, Evict):
                await self.retire(
                    decision.victim.model, decision.victim.worker_id, reason="evicted"
                )
                evicted = (decision.victim.model,)
            ready_at = self._clock()
            # A load of a model asleep on the worker wakes it there: it is not asleep after.
            await self._store.remove_sleeping(model.name, worker.id)
            report = await self._workers.load(worker, model)
            loaded_at = self._clock()
            placement = Placement(
                model=model.name,
                worker_id=worker.id,
                url=worker.url,
                generation=model.generation,
                since=self._wall(),
            )
            if worker.id not in {w.id for w in self._backend.list_workers()}:
                raise UpstreamError(worker=worker.id, reason="the worker went away during the load")
            await self._store.add_placement(placement)
            self._history.setdefault(worker.id, set()).add(model.name)
        finally:
            self._release(worker.id, model.name)
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

    async def _claim_room(self, model: ModelRecord) -> tuple[WorkerRecord, Decision]:
        """Choose a worker for ``model`` and reserve room there, under the lock; when the
        choice is a new worker, return once it has started (with the room reserved)."""
        need = model.resources.memory_bytes
        while True:
            start: asyncio.Task[WorkerRecord] | None = None
            waiting: set[asyncio.Task[WorkerRecord]] = set()
            async with self._lock:
                decision = choose(await self._view(model), model)
                match decision:
                    case NoCapacity(reason=reason):
                        raise NoCapacityError(model=model.name, reason=reason)
                    case Place(worker=worker) | Evict(worker=worker):
                        self._reserve(worker.id, model.name, need)
                        return worker, decision
                    case StartWorker():
                        start = self._begin_start(reserve=(model.name, need))
                    case WaitForStarts():
                        waiting = set(self._starts)
            if start is not None:
                try:
                    return await asyncio.shield(start), decision
                except asyncio.CancelledError:
                    # The start goes on without us; drop the room it reserved for us.
                    start.add_done_callback(partial(self._release_started, model=model.name))
                    raise
            # The pool is full of workers still starting: one of them may have room. (When
            # they ended while the traffic was read, the next choice sees their workers.)
            if waiting:
                await asyncio.wait(waiting)

    async def start_worker(self) -> WorkerRecord:
        """Start one worker of the pool and publish it; ``NoCapacityError`` at max_workers."""
        async with self._lock:
            if self._worker_count() >= self._pool.max_workers:
                raise NoCapacityError(
                    model="*", reason=f"the pool is at max_workers={self._pool.max_workers}"
                )
            task = self._begin_start()
        return await asyncio.shield(task)

    def _begin_start(self, *, reserve: tuple[str, int] | None = None) -> asyncio.Task[WorkerRecord]:
        task = asyncio.create_task(self._start(reserve), name=f"start-worker-{self._pool.name}")
        self._starts.add(task)
        task.add_done_callback(self._starts.discard)
        return task

    async def _start(self, reserve: tuple[str, int] | None) -> WorkerRecord:
        worker = await self._backend.start_worker(self._pool.name)
        if reserve is not None:
            # Reserved before any await: the reaper must not find the new worker idle.
            self._reserve(worker.id, *reserve)
        try:
            await self._store.put_worker(worker)
        except BaseException:
            if reserve is not None:
                self._release(worker.id, reserve[0])
            raise
        return worker

    def _release_started(self, task: asyncio.Task[WorkerRecord], *, model: str) -> None:
        if not task.cancelled() and task.exception() is None:
            self._release(task.result().id, model)

    def _worker_count(self) -> int:
        return len(self._backend.list_workers(self._pool.name)) + len(self._starts)

    async def _view(self, model: ModelRecord) -> PoolView:
        """The pool as ``choose`` needs it to place ``model``: every store read comes first,
        then the backend's workers and our bookkeeping, taken together with no await between
        them, then the traffic of the replicas it may evict."""
        placements = tuple(await self._store.list_placements())
        sleeping = tuple(await self._store.list_sleeping())
        models = {m.name: m for m in await self._store.list_models()}
        view = PoolView(
            pool=self._pool,
            workers=tuple(self._backend.list_workers(self._pool.name)),
            starting=len(self._starts),
            placements=placements,
            sleeping=sleeping,
            models=models,
            reserved={w: dict(loads) for w, loads in self._pending.items()},
            retiring=frozenset(self._retiring),
            unloading=frozenset(self._sleeper_unloads),
            stopping=frozenset(self._stopping),
            warm={w: frozenset(names) for w, names in self._history.items()},
            max_models_per_worker=self._settings.max_models_per_worker,
        )
        wanted = traffic_needed(view, model)
        if not wanted:
            return view
        traffic: dict[str, Traffic] = {}
        for name in sorted(wanted):
            reports = await self._store.traffic(name)
            traffic[name] = Traffic(
                in_flight=sum(r.in_flight for r in reports),
                last_request_at=max((r.last_request_at for r in reports), default=0.0),
            )
        return dataclasses.replace(view, traffic=traffic)

    def _reserve(self, worker_id: str, model: str, need: int) -> None:
        self._pending.setdefault(worker_id, {})[model] = need

    def _release(self, worker_id: str, model: str) -> None:
        pending = self._pending.get(worker_id)
        if pending is not None:
            pending.pop(model, None)
            if not pending:
                del self._pending[worker_id]

    async def reload(self, model: ModelRecord) -> None:
        """Load ``model``'s current generation in place on every worker that serves an older
        one; the worker keeps serving the old one until the new one is ready."""
        for placement in await self._store.list_placements(model.name):
            if placement.generation >= model.generation:
                continue
            worker = next(
                (w for w in self._backend.list_workers() if w.id == placement.worker_id), None
            )
            if worker is None:
                continue
            await self._workers.load(worker, model)
            await self._store.add_placement(
                dataclasses.replace(placement, generation=model.generation, since=self._wall())
            )
            logger.info(
                "reloaded %s on %s (generation %d)", model.name, worker.id, model.generation
            )

    # ---- retiring ----

    async def retire(self, model: str, worker_id: str, *, reason: str) -> None:
        """Take the replica of ``model`` on ``worker_id`` away, losing no request.

        Returns once the worker has unloaded it (or is gone). Joins a retirement already
        under way; does nothing when there is no such placement.
        """
        await self._take_away(model, worker_id, reason=reason, to_sleep=False)

    async def sleep(self, model: str, worker_id: str) -> None:
        """Put the replica of ``model`` on ``worker_id`` to sleep, losing no request: as
        :meth:`retire`, but the worker's engine sleeps instead of unloading, and the store
        records the replica as sleeping. A worker that cannot sleep it unloads it."""
        await self._take_away(model, worker_id, reason="sleep", to_sleep=True)

    async def _take_away(self, model: str, worker_id: str, *, reason: str, to_sleep: bool) -> None:
        key = (model, worker_id)
        retirement = self._retiring.get(key)
        if retirement is None:
            placement = next(
                (p for p in await self._store.list_placements(model) if p.worker_id == worker_id),
                None,
            )
            worker = next((w for w in self._backend.list_workers() if w.id == worker_id), None)
            retirement = self._retiring.get(key)  # one may have begun during the awaits
            if retirement is None:
                if placement is None:
                    return
                if worker is None:
                    await self._store.remove_placement(model, worker_id)
                    return
                retirement = _Retirement(
                    model=model, worker=worker, placement=placement, to_sleep=to_sleep
                )
                retirement.task = asyncio.create_task(
                    self._retire(retirement, reason), name=f"retire-{model}-{worker_id}"
                )
                self._retiring[key] = retirement
        assert retirement.task is not None
        # wait(), not shield(): the retirement's own cancellation (a revival) is no error
        # here, while a cancellation of the caller still propagates.
        await asyncio.wait([retirement.task])

    def retire_soon(self, model: str, worker_id: str, *, reason: str) -> None:
        """Start retiring a replica without waiting for it."""
        task = asyncio.create_task(
            self.retire(model, worker_id, reason=reason), name=f"retire-soon-{model}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def is_retiring(self, model: str) -> bool:
        return any(m == model for (m, _) in self._retiring)

    async def _retire(self, retirement: _Retirement, reason: str) -> None:
        model, worker = retirement.model, retirement.worker
        logger.info(
            "retiring %s from %s (%s)",
            model,
            worker.id,
            reason,
            extra={"model": model, "worker": worker.id},
        )
        try:
            await self._store.remove_placement(model, worker.id)
            await asyncio.sleep(self._settings.placement_propagation_s)
            retirement.phase = _Phase.DRAINING
            await self._drain(model)
            retirement.phase = _Phase.UNLOADING
            if retirement.to_sleep and await self._sleep_replica(retirement):
                return
            try:
                await self._workers.unload(worker, model)
            except UpstreamError as exc:
                logger.warning("unloading %s from %s: %s", model, worker.id, exc.message)
            logger.info("unloaded %s from %s", model, worker.id, extra={"model": model})
        finally:
            self._retiring.pop((model, worker.id), None)

    async def _sleep_replica(self, retirement: _Retirement) -> bool:
        """Ask the worker to put the drained replica to sleep and record it; False when the
        worker cannot (the caller unloads it instead)."""
        model, worker = retirement.model, retirement.worker
        try:
            await self._workers.sleep(worker, model)
        except UpstreamError as exc:
            logger.warning(
                "%s on %s cannot sleep (%s); unloading it", model, worker.id, exc.message
            )
            return False
        await self._store.put_sleeping(
            dataclasses.replace(retirement.placement, since=self._wall())
        )
        logger.info(
            "%s asleep on %s", model, worker.id, extra={"model": model, "worker": worker.id}
        )
        return True

    async def _wake(self, model: ModelRecord) -> PlaceResult | None:
        """Wake a sleeping replica of ``model``, if one is left of its current generation."""
        for sleeper in await self._store.list_sleeping(model.name):
            worker = next(
                (w for w in self._backend.list_workers() if w.id == sleeper.worker_id), None
            )
            if sleeper.generation != model.generation or worker is None:
                self._unload_sleeper_soon(sleeper.model, sleeper.worker_id)
                continue
            # Removing the record claims the replica: a concurrent unload_sleeping loses.
            if not await self._store.remove_sleeping(model.name, worker.id):
                continue
            started = self._clock()
            try:
                await self._workers.wake(worker, model.name)
            except UpstreamError as exc:
                logger.warning("waking %s on %s failed: %s", model.name, worker.id, exc.message)
                self._track_sleeper_unload(model.name, worker)
                continue
            woken_at = self._clock()
            placement = Placement(
                model=model.name,
                worker_id=worker.id,
                url=worker.url,
                generation=model.generation,
                since=self._wall(),
            )
            await self._store.add_placement(placement)
            self._history.setdefault(worker.id, set()).add(model.name)
            logger.info(
                "woke %s on %s in %.3f s",
                model.name,
                worker.id,
                woken_at - started,
                extra={"model": model.name, "worker": worker.id},
            )
            return PlaceResult(
                placement=placement,
                worker=worker,
                is_worker_started=False,
                is_revived=False,
                worker_ready_at=started,
                loaded_at=woken_at,
                load=None,
                is_woken=True,
            )
        return None

    async def unload_sleeping(self, model: str, worker_id: str) -> None:
        """Unload a sleeping replica (idle past its timeout, evicted, or stale); does nothing
        when it is not asleep any more (woken, or unloaded by someone else)."""
        key = (model, worker_id)
        running = self._sleeper_unloads.get(key)
        if running is None:
            if not await self._store.remove_sleeping(model, worker_id):
                return
            worker = next((w for w in self._backend.list_workers() if w.id == worker_id), None)
            if worker is None:
                return
            running = self._track_sleeper_unload(model, worker)
        await asyncio.wait([running])

    def _unload_sleeper_soon(self, model: str, worker_id: str) -> None:
        task = asyncio.create_task(
            self.unload_sleeping(model, worker_id), name=f"unload-sleeping-{model}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _track_sleeper_unload(self, model: str, worker: WorkerRecord) -> asyncio.Task[None]:
        """Unload ``model`` from ``worker`` (already claimed from the store) in a task that
        loads of the model wait for."""
        key = (model, worker.id)

        async def unload() -> None:
            try:
                await self._workers.unload(worker, model)
                logger.info("unloaded sleeping %s from %s", model, worker.id)
            except UpstreamError as exc:
                logger.warning("unloading sleeping %s from %s: %s", model, worker.id, exc.message)
            finally:
                self._sleeper_unloads.pop(key, None)

        task = asyncio.create_task(unload(), name=f"unload-sleeping-{model}-{worker.id}")
        self._sleeper_unloads[key] = task
        return task

    async def _drain(self, model: str) -> None:
        """Wait for the model's in-flight requests while no other replica serves it.

        With other replicas up the in-flight count is theirs too and never settles; the
        worker's unload then drains what this replica accepted.
        """
        deadline = self._clock() + self._settings.drain_timeout_s
        while self._clock() < deadline:
            if await self._store.list_placements(model):
                return
            reports = await self._store.traffic(model)
            if sum(r.in_flight for r in reports) == 0:
                return
            await asyncio.sleep(_DRAIN_POLL_S)
        logger.warning("drain of %s timed out; unloading anyway", model)

    async def _revive(self, model: ModelRecord) -> PlaceResult | None:
        """Put back a replica of ``model`` still in its propagation pause, if there is one."""
        for (name, _), retirement in list(self._retiring.items()):
            if name != model.name or retirement.phase is not _Phase.PROPAGATING:
                continue
            if retirement.placement.generation != model.generation:
                continue
            assert retirement.task is not None
            retirement.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await retirement.task
            if retirement.phase is not _Phase.PROPAGATING:
                continue  # it moved on before the cancel landed; let the unload finish
            now = self._clock()
            placement = Placement(
                model=model.name,
                worker_id=retirement.worker.id,
                url=retirement.worker.url,
                generation=model.generation,
                since=self._wall(),
            )
            await self._store.add_placement(placement)
            logger.info("revived %s on %s", model.name, retirement.worker.id)
            return PlaceResult(
                placement=placement,
                worker=retirement.worker,
                is_worker_started=False,
                is_revived=True,
                worker_ready_at=now,
                loaded_at=now,
                load=None,
            )
        return None

    async def _await_unloads(self, model: str) -> None:
        """Let unloads of ``model`` finish: a load racing an unload on one worker loses."""
        tasks: list[asyncio.Task[None]] = [
            r.task for (m, _), r in self._retiring.items() if m == model and r.task
        ]
        tasks += [t for (m, _), t in self._sleeper_unloads.items() if m == model]
        if tasks:
            await asyncio.wait(tasks)

    # ---- workers ----

    def is_idle(self, worker_id: str, placements: list[Placement]) -> bool:
        """No replica (``placements`` should hold sleeping ones too), load or unload on the
        worker."""
        return (
            worker_id not in self._pending
            and not any(w == worker_id for (_, w) in self._retiring)
            and not any(w == worker_id for (_, w) in self._sleeper_unloads)
            and not any(p.worker_id == worker_id for p in placements)
        )

    async def stop_worker_if_idle(self, worker_id: str) -> bool:
        """Stop the worker unless something was placed on it meanwhile; True if stopped."""
        async with self._lock:
            placements = await self._store.list_placements() + await self._store.list_sleeping()
            if not self.is_idle(worker_id, placements) or worker_id in self._stopping:
                return False
            self._stopping.add(worker_id)
        try:
            await self._store.remove_worker(worker_id)
            await self._backend.stop_worker(worker_id)
        finally:
            self._stopping.discard(worker_id)
            self._history.pop(worker_id, None)
        return True

    async def forget_worker(self, worker_id: str) -> None:
        """A worker died: drop its placements (publishing REMOVED) and what we knew of it."""
        await self._store.remove_worker(worker_id)
        self._history.pop(worker_id, None)
        for key in [k for k in self._retiring if k[1] == worker_id]:
            retirement = self._retiring.get(key)
            if retirement is not None and retirement.task is not None:
                retirement.task.cancel()

    async def close(self) -> None:
        """Cancel background retirements (the workers are stopped after this anyway)."""
        tasks: list[asyncio.Task[Any]] = [
            r.task for r in self._retiring.values() if r.task is not None
        ]
        tasks += [*self._tasks, *self._starts, *self._sleeper_unloads.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
