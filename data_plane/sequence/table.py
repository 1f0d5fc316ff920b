"""Which sequence holds which slot: the sequence batcher's decisions, with no I/O and no clock.

Triton's rules (``SequenceBatchScheduler::Enqueue``, ``ReleaseSequenceSlot`` and the reaper
thread), over a fixed set of slots:

* A request with the START flag whose correlation ID has no sequence running starts one: it
  takes the free slot with the lowest index, or joins the backlog when none is free. A
  request without START joins its correlation ID's sequence, wherever it is (slot or
  backlog); with no sequence running it is refused.
* START for a correlation ID whose sequence runs does not start another: the request joins
  that sequence (the model sees START again and resets; Triton logs a conflict).
* The END flag unbinds the correlation ID at once: the sequence's queued requests still
  run, and a later request of that ID starts a new sequence or is refused.
* A sequence holds its slot until it is unbound and has nothing queued or running; the slot
  then goes to the oldest backlogged sequence, else back to the free slots.
* A sequence in a slot whose last request arrived ``idle_us`` ago or more is ended by the
  reaper (unbound, so its slot frees once its queue drains). A backlogged one is not: it is
  looked at again once it has a slot.
* A backlogged sequence whose requests carried a ``timeout`` fails when the earliest of
  them runs out.

Every method takes the time it should act at (``now_us``) as an argument; the scheduler owns
the clock, the queues' contents and the tasks.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from data_plane.sequence.errors import (
    SequenceBacklogFullError,
    SequenceNotStartedError,
)
from data_plane.sequence.state import SequenceState

T = TypeVar("T")

CorrelationId = int | str
"""A sequence's key: a uint64 (never 0) or a non-empty string."""

START: Final = 1
"""Triton's ``TRITONSERVER_REQUEST_FLAG_SEQUENCE_START``."""
END: Final = 2
"""Triton's ``TRITONSERVER_REQUEST_FLAG_SEQUENCE_END``."""

_UINT64: Final = 1 << 64


def correlation_id_of(value: object) -> CorrelationId | None:
    """A request's ``sequence_id`` parameter as its sequence's key; None when it names no
    sequence (absent, 0 or ""). An integer is read as Triton reads it, as a uint64: gRPC's
    ``int64_param`` -5 is sequence 18446744073709551611."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value % _UINT64 or None
    if isinstance(value, str):
        return value or None
    return None


@dataclass(frozen=True, slots=True, order=True)
class Slot:
    """One sequence slot: its row in its lane's batches, and the lane (a model instance's
    share of the slots)."""

    index: int
    lane: int


class Run(Generic[T]):
    """One sequence from its START until it ends and leaves its slot.

    ``queue`` holds its requests not yet sent to the model; the scheduler takes them from
    its head. ``is_running`` and ``state`` are the scheduler's: whether a request of it is
    executing, and its implicit state.
    """

    __slots__ = (
        "correlation_id",
        "expires_us",
        "is_bound",
        "is_running",
        "last_seen_us",
        "queue",
        "slot",
        "state",
    )

    def __init__(self, correlation_id: CorrelationId, now_us: int) -> None:
        self.correlation_id = correlation_id
        self.slot: Slot | None = None
        self.queue: deque[T] = deque()
        self.is_bound = True
        """Requests of its correlation ID still come here (no END, not ended by the reaper)."""
        self.is_running = False
        self.last_seen_us = now_us
        self.expires_us = 0
        """In the backlog: when it fails for its requests' ``timeout`` (0: never)."""
        self.state: SequenceState | None = None
        """Its implicit state, the scheduler's to make and keep."""

    @property
    def is_done(self) -> bool:
        """Whether its slot can go: unbound, with nothing queued or executing."""
        return not self.is_bound and not self.queue and not self.is_running


@dataclass(frozen=True, slots=True)
class Admission(Generic[T]):
    """Where :meth:`SequenceTable.admit` put a request."""

    run: Run[T]
    is_new: bool
    """The request started a new sequence (rather than joining a running one)."""
    has_new_slot: bool
    """The sequence was given a slot by this admission: its lane has new work."""


class SequenceTable(Generic[T]):
    """The sequences of one model version: which run each correlation ID is bound to, the
    slots they hold, and the backlog of those waiting for one.

    Parameters:
        model: the model's name, for the errors' texts.
        slots: every slot of the version.
        idle_us: ``max_sequence_idle_microseconds``.
        max_backlog: how many sequences may wait for a slot; past it a new one is refused
            with SequenceBacklogFullError.
    """

    def __init__(
        self, model: str, slots: Iterable[Slot], *, idle_us: int, max_backlog: int
    ) -> None:
        self._model = model
        self._free: list[Slot] = sorted(slots)
        heapq.heapify(self._free)
        self._idle_us = idle_us
        self._max_backlog = max_backlog
        self._bound: dict[CorrelationId, Run[T]] = {}
        self._backlog: deque[Run[T]] = deque()

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def backlog(self) -> int:
        """Sequences waiting for a slot."""
        return len(self._backlog)

    @property
    def live(self) -> int:
        """Sequences running: started, not yet ended by END or the reaper."""
        return len(self._bound)

    def admit(
        self,
        correlation_id: CorrelationId,
        flags: int,
        item: T,
        *,
        now_us: int,
        timeout_us: int = 0,
    ) -> Admission[T]:
        """Put ``item`` (a request with ``flags``) into its sequence's run.

        Raises SequenceNotStartedError for a request without START whose ID has no
        sequence running, SequenceBacklogFullError when it would start a sequence that
        must wait and the backlog is full.
        """
        run = self._bound.get(correlation_id)
        is_new = run is None
        has_new_slot = False
        if run is None:
            if not flags & START:
                raise SequenceNotStartedError(model=self._model, correlation_id=correlation_id)
            if not self._free and len(self._backlog) >= self._max_backlog:
                raise SequenceBacklogFullError(model=self._model)
            run = Run(correlation_id, now_us)
            if self._free:
                run.slot = heapq.heappop(self._free)
                has_new_slot = True
            else:
                self._backlog.append(run)
            self._bound[correlation_id] = run
        run.last_seen_us = now_us
        if run.slot is None and timeout_us:
            deadline = now_us + timeout_us
            run.expires_us = min(run.expires_us, deadline) if run.expires_us else deadline
        run.queue.append(item)
        if flags & END:
            self._unbind(run)
        return Admission(run, is_new, has_new_slot)

    def end(self, run: Run[T]) -> None:
        """Stop routing requests to ``run`` (a cancelled sequence); a later request of its
        ID starts a new sequence or is refused."""
        self._unbind(run)

    def release(self, run: Run[T]) -> Run[T] | None:
        """``run`` is done: give its slot to the oldest backlogged sequence (returned, its
        requests now the slot's) or back to the free slots (None)."""
        slot = run.slot
        if slot is None or not run.is_done:
            raise ValueError("only a done run that holds a slot can release it")
        run.slot = None
        while self._backlog:
            waiting = self._backlog.popleft()
            if not waiting.queue and not waiting.is_bound:
                continue  # emptied by the scheduler (its requests failed or were cancelled)
            waiting.slot = slot
            waiting.expires_us = 0
            return waiting
        heapq.heappush(self._free, slot)
        return None

    def reap_idle(self, now_us: int) -> tuple[list[Run[T]], int]:
        """End every sequence in a slot idle for ``idle_us`` or more; return them and when
        to look again (-1: no sequence holds a slot)."""
        ended: list[Run[T]] = []
        due = -1
        for run in list(self._bound.values()):
            if run.slot is None:
                continue
            expires = run.last_seen_us + self._idle_us
            if expires <= now_us:
                self._unbind(run)
                ended.append(run)
            elif due < 0 or expires < due:
                due = expires
        return ended, due

    def expire_backlog(self, now_us: int) -> tuple[list[Run[T]], int]:
        """Take out every backlogged sequence whose timeout ran out; return them (their
        requests to fail) and when the next one runs out (-1: none has a timeout)."""
        expired: list[Run[T]] = []
        due = -1
        kept: deque[Run[T]] = deque()
        for run in self._backlog:
            if run.expires_us and run.expires_us <= now_us:
                if self._bound.get(run.correlation_id) is run:
                    self._unbind(run)
                expired.append(run)
                continue
            kept.append(run)
            if run.expires_us and (due < 0 or run.expires_us < due):
                due = run.expires_us
        self._backlog = kept
        return expired, due

    def drain_backlog(self) -> list[Run[T]]:
        """Take every backlogged sequence out (the batcher is closing); they are ended."""
        runs = list(self._backlog)
        self._backlog.clear()
        for run in runs:
            self._unbind(run)
        return runs

    def _unbind(self, run: Run[T]) -> None:
        if run.is_bound:
            run.is_bound = False
            if self._bound.get(run.correlation_id) is run:
                del self._bound[run.correlation_id]
