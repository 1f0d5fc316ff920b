"""The request queue: queued requests, their priority levels and the walk that forms a batch.

Owns every request from submit until a batch takes it or it leaves without executing
(cancelled, timed out, or failed at close), the per-level bounds and timeouts of Triton's
queue policies, and the walk that decides the next batch as Triton's ``GetDynamicBatch`` does.
Also `BatchedResult`, what a queued request's future resolves to. No tasks and no timers
here: the scheduler owns those and calls in.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np

from data_plane.batcher.policy import BatchPolicy, QueuePolicy
from data_plane.errors import RequestTimeoutError
from runtimes.model_request import RequestContext

# A queued request's state: waiting, taken into a batch, or left without executing.
QUEUED: Final = 0
TAKEN: Final = 1
GONE: Final = 2

_COMPACT_AT: Final = 64
"""Withdrawn requests a level tolerates in its deques before it rebuilds them."""


# Not frozen: built once per request on the hot path, where a frozen dataclass's __init__
# (object.__setattr__ per field) costs about three times as much.
@dataclass(slots=True)
class BatchedResult:
    """One request's share of an execution, with the timings Triton's statistics and traces
    need (times read from the batcher's clock, ``time.monotonic_ns`` when serving)."""

    outputs: dict[str, np.ndarray]
    """This request's own rows of every output (views into the batch's arrays)."""
    queue_ns: int
    """From enqueue to the engine call of the execution it was part of."""
    compute_ns: int
    """How long the engine call took."""
    batch_size: int
    """Total rows (requests, with batching off) of that execution."""
    compute_start_ns: int
    """When the engine was called: the batch's inputs were gathered (Triton's
    COMPUTE_INPUT_END); enqueue was ``queue_ns`` before it."""
    exec_start_ns: int
    """When the execution began, before its inputs were gathered (COMPUTE_START)."""
    exec_end_ns: int
    """When the outputs were split among the batch's requests (COMPUTE_END)."""


class PriorityLevel:
    """One priority level's queue: unexpired requests, then the timed-out DELAY ones."""

    __slots__ = (
        "can_override",
        "dead",
        "delayed",
        "max_size",
        "queued",
        "rejects",
        "size",
        "timeout_ns",
    )

    def __init__(self, policy: QueuePolicy) -> None:
        self.queued: deque[QueuedRequest] = deque()
        self.delayed: deque[QueuedRequest] = deque()
        self.size = 0  # live requests in both deques
        self.dead = 0  # withdrawn requests still in the deques, dropped when a walk meets them
        self.max_size = policy.max_queue_size
        self.timeout_ns = policy.default_timeout_us * 1000
        self.can_override = policy.allow_timeout_override
        self.rejects = policy.timeout_action == "REJECT"


class QueuedRequest:
    """One request from submit until a batch takes it or it leaves (see the states above)."""

    __slots__ = (
        "context",
        "deadline_ns",
        "delayed",
        "enqueue_ns",
        "future",
        "inputs",
        "level",
        "request_id",
        "rows",
        "shapes",
        "size",
        "state",
        "timer",
    )

    def __init__(
        self,
        inputs: Mapping[str, np.ndarray],
        rows: int,
        shapes: dict[str, tuple[int, ...]] | None,
        future: asyncio.Future[BatchedResult],
        enqueue_ns: int,
        deadline_ns: int,
        level: PriorityLevel,
        request_id: str | None,
        context: RequestContext | None = None,
    ) -> None:
        self.inputs = inputs
        self.rows = rows
        # Triton counts a request as max(1, dim 0) rows towards batch sizes.
        self.size = rows if rows > 1 else 1
        self.shapes = shapes
        self.future = future
        self.enqueue_ns = enqueue_ns
        self.deadline_ns = deadline_ns
        self.level = level
        self.request_id = request_id
        # Only for engines that take requests one by one (``Batcher(execute_requests=)``).
        self.context = context
        self.state = QUEUED
        self.timer: asyncio.TimerHandle | None = None
        self.delayed = False


class RequestQueue:
    """Triton's per-priority request queues and the walk that takes the next batch off them.

    ``on_discard`` is called each time a queued request leaves without executing, once it is
    no longer counted in `pending`.
    """

    def __init__(self, policy: BatchPolicy, *, on_discard: Callable[[], None]) -> None:
        self._on_discard = on_discard
        self._max_batch_size = policy.max_batch_size
        self._preferred = frozenset(policy.preferred_batch_sizes)
        self._max_preferred = max(policy.preferred_batch_sizes, default=0)
        self._delay_ns = policy.max_queue_delay_us * 1000
        policies = policy.priority_queue_policies if policy.priority_levels else {}
        self._levels = tuple(
            PriorityLevel(policies.get(level, policy.default_queue_policy))
            for level in range(1, max(policy.priority_levels, 1) + 1)
        )
        self._default_level = self._levels[max(policy.default_priority_level, 1) - 1]
        # The walk order: each level's unexpired requests, then its delayed ones.
        self._queues = tuple(
            (level, queue) for level in self._levels for queue in (level.queued, level.delayed)
        )
        self._pending = 0

    @property
    def pending(self) -> int:
        """Requests queued and not yet taken into a batch."""
        return self._pending

    def level_for(self, priority: int) -> PriorityLevel:
        """The level a request of ``priority`` joins."""
        levels = self._levels
        return levels[priority - 1] if 0 < priority <= len(levels) else self._default_level

    def push(self, request: QueuedRequest) -> None:
        """Queue a new request at the tail of its level."""
        level = request.level
        level.queued.append(request)
        level.size += 1
        self._pending += 1

    def form(self, now: int, *, closing: bool) -> tuple[list[QueuedRequest] | None, int]:
        """Take the next batch off the queue, as Triton's ``GetDynamicBatch`` decides.

        Returns ``(batch, 0)`` to execute now, ``(None, ns)`` to look again after ``ns``
        or at the next arrival, and ``(None, -1)`` when nothing is queued. With batching
        off the same walk yields one request: every size exceeds a maximum of 0.
        """
        taken: list[QueuedRequest] = []
        pending = 0
        best = 0
        best_count = 0
        send_now = False
        shapes = None
        oldest = now
        max_batch = self._max_batch_size
        max_preferred = self._max_preferred
        preferred = self._preferred
        for level, queue in self._queues:
            if not level.size:
                continue
            while queue:
                request = queue[0]
                if request.state != QUEUED:
                    queue.popleft()
                    level.dead -= 1
                    continue
                if request.future.done():
                    # The caller was cancelled and its handler has not run yet.
                    queue.popleft()
                    self._discard(request)
                    continue
                if request.deadline_ns and now >= request.deadline_ns:
                    queue.popleft()
                    if level.rejects:
                        self._discard(request)
                        error = RequestTimeoutError(request_id=request.request_id)
                        fail_future(request.future, error)
                    else:
                        request.deadline_ns = 0
                        request.delayed = True
                        level.delayed.append(request)
                    continue
                size = request.size
                if taken:
                    # Past the largest preferred size the batch stops at what it has,
                    # unless the delay runs out first; past the maximum, or at another
                    # shape, it goes as it is (the request is not skipped over).
                    if pending + size > max_preferred and not best:
                        best = pending
                        best_count = len(taken)
                    if pending + size > max_batch or request.shapes != shapes:
                        send_now = True
                        break
                else:
                    shapes = request.shapes
                queue.popleft()
                taken.append(request)
                pending += size
                if request.enqueue_ns < oldest:
                    oldest = request.enqueue_ns
                if pending in preferred:
                    best = pending
                    best_count = len(taken)
            if send_now:
                break

        delay_ns = self._delay_ns
        is_delay_exceeded = delay_ns > 0 and now - oldest >= delay_ns
        if best and not is_delay_exceeded:
            self._restore(taken[best_count:])
            del taken[best_count:]
        elif not taken:
            return None, -1
        elif not (
            send_now or pending >= max_preferred or is_delay_exceeded or not delay_ns or closing
        ):
            # Triton also wakes at the closest queue deadline; here REJECT timers fire on
            # their own and the walk that sends the batch applies DELAY, so only the
            # delay (and arrivals) can change the decision.
            self._restore(taken)
            return None, delay_ns - (now - oldest)
        for request in taken:
            request.state = TAKEN
            request.level.size -= 1
            if request.timer is not None:
                request.timer.cancel()
        self._pending -= len(taken)
        return taken, 0

    def _restore(self, requests: list[QueuedRequest]) -> None:
        """Put walked requests back at the heads they came from, in their order."""
        for request in reversed(requests):
            level = request.level
            (level.delayed if request.delayed else level.queued).appendleft(request)

    def withdraw(self, request: QueuedRequest) -> None:
        """Take a queued request out wherever it is; its deque entry becomes a tombstone."""
        self._discard(request)
        level = request.level
        level.dead += 1
        if level.dead > _COMPACT_AT and level.dead > level.size:
            # Rebuild once tombstones outnumber live requests: O(1) amortized per
            # withdrawal, and a storm of cancellations cannot grow the deques unbounded.
            for queue in (level.queued, level.delayed):
                live = [r for r in queue if r.state == QUEUED]
                queue.clear()
                queue.extend(live)
            level.dead = 0

    def _discard(self, request: QueuedRequest) -> None:
        """Account for a queued request that leaves without executing."""
        request.state = GONE
        request.level.size -= 1
        self._pending -= 1
        if request.timer is not None:
            request.timer.cancel()
            request.timer = None
        self._on_discard()

    def fail_queued(self, error: BaseException) -> None:
        """Fail every request still queued with ``error`` and empty the queues."""
        for level, queue in self._queues:
            for request in queue:
                if request.state == QUEUED:
                    self._discard(request)
                    fail_future(request.future, error)
            queue.clear()
            level.dead = 0


def fail_future(future: asyncio.Future[BatchedResult], error: BaseException) -> None:
    """Fail a request's future with ``error`` unless it already has an outcome."""
    if not future.done():
        future.set_exception(error)
