"""Taking replicas away without losing a request: retiring them, or putting them to sleep.

A replica is retired in the order that loses no request: the placement is removed first (new
requests take the activation path), activators are given ``placement_propagation_s`` to see
that, in-flight requests drain (bounded by ``drain_timeout_s``), and only then the worker
unloads. A placement asked for while its replica is still in the propagation pause is revived
in place instead (:meth:`Retirements.revive`).

A replica of an LLM can be put to sleep the same way instead of unloaded: after the drain the
worker puts its engine to sleep and the store records the replica as sleeping (activators
never see those). A sleeper's weights stay in the worker's host memory: where they would not
fit in its budget (``control_plane.placement.host_memory``) the replica is unloaded instead.
Waking it, or unloading it later, is ``control_plane.placement.wake``.

A replica whose worker reports live sequences (a sequence model's state, which no other
replica has) is not taken away for being idle or surplus: that would cut them. It stays
until they end; the reaper or the autoscaler asks again on its next round. Other reasons
(the model deleted or replaced, an operator's unload) take it away regardless.
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
from typing import Protocol

from control_plane.errors import WorkerCallError
from control_plane.placement.host_memory import SleepRoom, sleep_room
from control_plane.store.base import StateStore
from foundation.records import ModelRecord, Placement, WorkerRecord

__all__ = ["FindWorker", "LiveSequences", "ReplicaUnloader", "Retirements"]

logger = logging.getLogger(__name__)

_DRAIN_POLL_S = 0.1

FindWorker = Callable[[str], WorkerRecord | None]
"""The worker with this id, if the backend still has it."""


class ReplicaUnloader(Protocol):
    """What retiring needs of the workers' HTTP API."""

    async def unload(self, worker: WorkerRecord, model: str) -> None: ...

    async def sleep(self, worker: WorkerRecord, model: str) -> None: ...


class LiveSequences(Protocol):
    """How many sequences of a model run on a worker (``WorkerClient.live_sequences``)."""

    async def live_sequences(self, worker: WorkerRecord, model: str) -> int: ...


_KEEP_LIVE_SEQUENCES = frozenset({"idle", "scale_down", "sleep"})
"""The reasons that wait for a replica's live sequences to end."""


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


class Retirements:
    """The replicas being taken away, each in a task of its own, one per (model, worker).

    Parameters:
        store: placements are removed and sleeping replicas recorded here; its traffic
            tells when a drain is over.
        workers: the unload and sleep calls to workers.
        find_worker: the backend's record of a worker, by id.
        propagation_s: how long activators get to see a removed placement.
        drain_timeout_s: the longest wait for in-flight requests before unloading anyway.
        clock: monotonic seconds (the drain's deadline).
        wall: wall-clock seconds since the epoch (when a replica fell asleep).
        sequences: asked before a replica is taken away for being idle or surplus; None
            takes replicas away without asking.
        host_memory_bytes: host memory on one worker for sleeping replicas' weights; a
            replica that would not fit is unloaded instead (``host_memory``); 0: unbounded.
    """

    def __init__(
        self,
        store: StateStore,
        workers: ReplicaUnloader,
        find_worker: FindWorker,
        *,
        propagation_s: float,
        drain_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sequences: LiveSequences | None = None,
        host_memory_bytes: int = 0,
    ) -> None:
        self._host_memory_bytes = host_memory_bytes
        self._falling_asleep: dict[tuple[str, str], int] = {}
        """(model, worker id) -> bytes of replicas counted as asleep but not yet recorded."""
        self._store = store
        self._workers = workers
        self._find_worker = find_worker
        self._propagation_s = propagation_s
        self._drain_timeout_s = drain_timeout_s
        self._clock = clock
        self._wall = wall
        self._sequences = sequences
        self._retiring: dict[tuple[str, str], _Retirement] = {}
        self._soon: set[asyncio.Task[None]] = set()

    async def retire(self, model: str, worker_id: str, *, reason: str) -> None:
        """Take the replica of ``model`` on ``worker_id`` away, losing no request.

        Returns once the worker has unloaded it (or is gone). Joins a retirement already
        under way; does nothing when there is no such placement.
        """
        await self._take_away(model, worker_id, reason=reason, to_sleep=False)

    async def sleep(self, model: str, worker_id: str) -> None:
        """As :meth:`retire`, but the worker's engine sleeps instead of unloading, and the
        store records the replica as sleeping. A worker that cannot sleep it unloads it."""
        await self._take_away(model, worker_id, reason="sleep", to_sleep=True)

    def retire_soon(self, model: str, worker_id: str, *, reason: str) -> None:
        """Start retiring a replica without waiting for it."""
        task = asyncio.create_task(
            self.retire(model, worker_id, reason=reason), name=f"retire-soon-{model}"
        )
        self._soon.add(task)
        task.add_done_callback(self._soon.discard)

    def is_retiring(self, model: str) -> bool:
        return any(m == model for (m, _) in self._retiring)

    def pairs(self) -> frozenset[tuple[str, str]]:
        """(model, worker id) of every retirement under way."""
        return frozenset(self._retiring)

    def is_on(self, worker_id: str) -> bool:
        """A retirement is under way on the worker."""
        return any(w == worker_id for (_, w) in self._retiring)

    def tasks_of(self, model: str) -> list[asyncio.Task[None]]:
        """The retirements of ``model`` under way (a load of it waits for them)."""
        return [r.task for (m, _), r in self._retiring.items() if m == model and r.task]

    def cancel_on(self, worker_id: str) -> None:
        """The worker died: stop its retirements where they are."""
        for key in [k for k in self._retiring if k[1] == worker_id]:
            retirement = self._retiring.get(key)
            if retirement is not None and retirement.task is not None:
                retirement.task.cancel()

    def tasks(self) -> list[asyncio.Task[None]]:
        """Every background task, for the placer to cancel when it closes."""
        tasks = [r.task for r in self._retiring.values() if r.task is not None]
        return [*tasks, *self._soon]

    async def revive(self, model: ModelRecord) -> WorkerRecord | None:
        """Stop a retirement of ``model``'s current generation that is still in its
        propagation pause, and return its worker (the replica is still loaded there); the
        caller publishes the placement again. None when there is none."""
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
            return retirement.worker
        return None

    async def _take_away(self, model: str, worker_id: str, *, reason: str, to_sleep: bool) -> None:
        key = (model, worker_id)
        retirement = self._retiring.get(key)
        if retirement is None:
            placement = next(
                (p for p in await self._store.list_placements(model) if p.worker_id == worker_id),
                None,
            )
            worker = self._find_worker(worker_id)
            if (
                placement is not None
                and worker is not None
                and reason in _KEEP_LIVE_SEQUENCES
                and await self._holds_sequences(worker, model)
            ):
                return
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

    async def _holds_sequences(self, worker: WorkerRecord, model: str) -> bool:
        """Whether ``worker`` reports live sequences of ``model``; a worker that does not
        answer holds none that anyone could still reach."""
        if self._sequences is None:
            return False
        try:
            live = await self._sequences.live_sequences(worker, model)
        except WorkerCallError as exc:
            logger.warning("asking %s for live sequences of %s: %s", worker.id, model, exc.message)
            return False
        if live:
            logger.info(
                "keeping %s on %s: %d live sequences",
                model,
                worker.id,
                live,
                extra={"model": model, "worker": worker.id},
            )
        return live > 0

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
            await asyncio.sleep(self._propagation_s)
            retirement.phase = _Phase.DRAINING
            await self._drain(model)
            retirement.phase = _Phase.UNLOADING
            if retirement.to_sleep and await self._sleep_replica(retirement):
                return
            try:
                await self._workers.unload(worker, model)
            except WorkerCallError as exc:
                logger.warning("unloading %s from %s: %s", model, worker.id, exc.message)
            logger.info("unloaded %s from %s", model, worker.id, extra={"model": model})
        finally:
            self._retiring.pop((model, worker.id), None)

    async def _sleep_replica(self, retirement: _Retirement) -> bool:
        """Ask the worker to put the drained replica to sleep and record it; False when its
        host memory has no room for it or the worker cannot (the caller unloads it)."""
        model, worker = retirement.model, retirement.worker
        key = (model, worker.id)
        room = await self._sleep_room(model, worker.id)
        if not room.fits:
            logger.info(
                "%s on %s unloads instead of sleeping: %s",
                model,
                worker.id,
                room.reason,
                extra={"model": model, "worker": worker.id},
            )
            return False
        self._falling_asleep[key] = await self._replica_bytes(model)
        try:
            try:
                await self._workers.sleep(worker, model)
            except WorkerCallError as exc:
                logger.warning(
                    "%s on %s cannot sleep (%s); unloading it", model, worker.id, exc.message
                )
                return False
            await self._store.put_sleeping(
                dataclasses.replace(retirement.placement, since=self._wall())
            )
        finally:
            self._falling_asleep.pop(key, None)
        logger.info(
            "%s asleep on %s", model, worker.id, extra={"model": model, "worker": worker.id}
        )
        return True

    async def _sleep_room(self, model: str, worker_id: str) -> SleepRoom:
        if self._host_memory_bytes <= 0:
            return sleep_room(budget=0, asleep=(), replica=0)
        recorded = [
            s.model
            for s in await self._store.list_sleeping()
            if s.worker_id == worker_id and s.model != model
        ]
        asleep = [await self._replica_bytes(name) for name in recorded]
        asleep += [b for (m, w), b in self._falling_asleep.items() if w == worker_id]
        replica = await self._replica_bytes(model)
        return sleep_room(budget=self._host_memory_bytes, asleep=asleep, replica=replica)

    async def _replica_bytes(self, model: str) -> int:
        record = await self._store.get_model(model)
        return record.resources.memory_bytes if record is not None else 0

    async def _drain(self, model: str) -> None:
        """Wait for the model's in-flight requests while no other replica serves it.

        With other replicas up the in-flight count is theirs too and never settles; the
        worker's unload then drains what this replica accepted.
        """
        deadline = self._clock() + self._drain_timeout_s
        while self._clock() < deadline:
            if await self._store.list_placements(model):
                return
            reports = await self._store.traffic(model)
            if sum(r.in_flight for r in reports) == 0:
                return
            await asyncio.sleep(_DRAIN_POLL_S)
        logger.warning("drain of %s timed out; unloading anyway", model)
