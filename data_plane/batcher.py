"""The dynamic batcher: Triton's request queue, batch forming and instance dispatch.

A :class:`Batcher` sits between the request handlers and one loaded engine (it wraps
``runtime.infer``, it does not patch it). Each request waits in a bounded queue per
priority level; every idle instance takes the next batch the queue gives under Triton's
dynamic batcher rules (``GetDynamicBatch`` in ``dynamic_batch_scheduler.cc``), runs it,
and hands every request its own rows of the outputs.

How it maps onto Triton:

* One asyncio task per model instance, each running one execution at a time. An idle
  instance forms the next batch itself, one at a time (a lock), as Triton's per-runner
  scheduler threads did; so a batch forms only when an instance is free, and requests
  that arrive while every instance is busy pile up into bigger batches.
* The walk visits priority levels in order (1 first), FIFO within a level, a level's
  timed-out DELAY requests after its unexpired ones. It applies the queue policy to each
  request it reaches: expired REJECT requests fail, expired DELAY requests move back.
* REJECT timeouts also fire on their own (one loop timer per such request) so that a
  request times out while every instance is busy; DELAY needs no timer because moving a
  request back only matters to the next walk, which applies the policy itself.
* Decisions read time only from the injected clock; loop timers only say when to look.

Not here: Triton's payload prefetching and merging of formed-but-unstarted batches (a
batch forms only when an instance is free, so it is never formed early), the response
cache and ``preserve_ordering``.

Costs: :meth:`Batcher.submit` is O(number of inputs). Forming a batch is O(requests it
walks). While an idle instance waits out ``max_queue_delay_us`` every arrival re-walks
the pending requests, as Triton does when shapes must be checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

import numpy as np

from data_plane.errors import (
    InternalError,
    InvalidArgumentError,
    QueueFullError,
    RequestTimeoutError,
    ServerStoppingError,
    ZeroserveError,
    request_prefix,
)
from data_plane.proto.model_config_pb2 import ModelConfig, ModelQueuePolicy

__all__ = ["BatchPolicy", "BatchedResult", "Batcher", "Execute", "QueuePolicy"]

logger = logging.getLogger(__name__)

_QUEUED: Final = 0
_TAKEN: Final = 1
_GONE: Final = 2

_COMPACT_AT: Final = 64
"""Withdrawn requests a level tolerates in its deques before it rebuilds them."""


class Execute(Protocol):
    """Runs one batch on the engine; ``ModelRuntime.infer`` is one."""

    async def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy`` for one priority level."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    """What happens to a request still queued at its timeout: fail it, or move it back."""
    default_timeout_us: int = 0
    """How long a request may wait in the queue; 0 is no limit."""
    allow_timeout_override: bool = False
    """A request's own timeout counts when it is non-zero and shorter than the default."""
    max_queue_size: int = 0
    """Queued requests this level holds (delayed ones included); 0 leaves only the hard bound."""


@dataclass(frozen=True)
class BatchPolicy:
    """Everything the batcher takes from a model's config, with Triton's defaults."""

    max_batch_size: int = 0
    """Most rows in one execution; 0 turns batching off (one request per execution)."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """Batch sizes sent as soon as reached; sorted, and ``(max_batch_size,)`` when empty."""
    max_queue_delay_us: int = 0
    """How long the oldest request may wait for a fuller batch; 0 sends what there is."""
    priority_levels: int = 0
    """Number of priority levels (1 is served first); 0 is one level and no priorities."""
    default_priority_level: int = 0
    """The level of requests with priority 0 or above ``priority_levels``."""
    default_queue_policy: QueuePolicy = QueuePolicy()
    """The queue policy of levels ``priority_queue_policies`` does not name."""
    priority_queue_policies: Mapping[int, QueuePolicy] = field(default_factory=dict)
    """Queue policy by priority level; only read when ``priority_levels`` is set."""
    instance_count: int = 1
    """Executions that may run at once (the model's instances)."""
    queue_bound: int = 4096
    """Hard bound on queued requests, whatever the config says; beyond it QueueFullError."""

    def __post_init__(self) -> None:
        # Normally model_config.normalize has checked all of this with Triton's texts; a
        # policy built by hand gets the same checks so that the batcher can rely on them.
        if self.max_batch_size < 0:
            raise ValueError("'max_batch_size' must be non-negative value")
        for size in self.preferred_batch_sizes:
            if size <= 0:
                raise ValueError("dynamic batching preferred size must be positive")
            if size > self.max_batch_size:
                raise ValueError("dynamic batching preferred size must be <= max batch size")
        preferred = tuple(sorted(set(self.preferred_batch_sizes)))
        if not preferred and self.max_batch_size > 0:
            preferred = (self.max_batch_size,)
        object.__setattr__(self, "preferred_batch_sizes", preferred)
        levels = self.priority_levels
        if levels:
            if not 1 <= self.default_priority_level <= levels:
                raise ValueError(f"default priority level must be in range [1, {levels}]")
            for level in self.priority_queue_policies:
                if not 1 <= level <= levels:
                    raise ValueError(
                        f"priority queue policy must have priority level in range [1, {levels}]"
                    )
        if self.instance_count < 1:
            raise ValueError("instance_count must be at least 1")
        if self.queue_bound < 1:
            raise ValueError("queue_bound must be at least 1")

    @classmethod
    def from_config(cls, config: ModelConfig, *, queue_bound: int = 4096) -> BatchPolicy:
        """The policy a (normalized) model config asks for.

        Without ``dynamic_batching`` this is Triton's default scheduler: batching off even
        when ``max_batch_size`` > 0, one level, no timeouts, still one execution per
        instance at a time. The instance count is the sum of the groups' counts.
        """
        instance_count = sum(max(group.count, 1) for group in config.instance_group) or 1
        if not config.HasField("dynamic_batching"):
            return cls(instance_count=instance_count, queue_bound=queue_bound)
        batching = config.dynamic_batching
        return cls(
            max_batch_size=config.max_batch_size,
            preferred_batch_sizes=tuple(batching.preferred_batch_size),
            max_queue_delay_us=batching.max_queue_delay_microseconds,
            priority_levels=batching.priority_levels,
            default_priority_level=batching.default_priority_level,
            default_queue_policy=_queue_policy(batching.default_queue_policy),
            priority_queue_policies={
                level: _queue_policy(policy)
                for level, policy in batching.priority_queue_policy.items()
            },
            instance_count=instance_count,
            queue_bound=queue_bound,
        )


def _queue_policy(message: ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        timeout_action="DELAY" if message.timeout_action == ModelQueuePolicy.DELAY else "REJECT",
        default_timeout_us=message.default_timeout_microseconds,
        allow_timeout_override=message.allow_timeout_override,
        max_queue_size=message.max_queue_size,
    )


@dataclass(frozen=True, slots=True)
class BatchedResult:
    """One request's share of an execution, with the timings Triton's statistics need."""

    outputs: dict[str, np.ndarray]
    """This request's own rows of every output (views into the batch's arrays)."""
    queue_ns: int
    """From enqueue to the start of the execution it was part of."""
    compute_ns: int
    """How long that execution took."""
    batch_size: int
    """Total rows (requests, with batching off) of that execution."""


class _Level:
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
        self.queued: deque[_Request] = deque()
        self.delayed: deque[_Request] = deque()
        self.size = 0  # live requests in both deques
        self.dead = 0  # withdrawn requests still in the deques, dropped when a walk meets them
        self.max_size = policy.max_queue_size
        self.timeout_ns = policy.default_timeout_us * 1000
        self.can_override = policy.allow_timeout_override
        self.rejects = policy.timeout_action == "REJECT"


class _Request:
    __slots__ = (
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
        level: _Level,
        request_id: str | None,
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
        self.state = _QUEUED
        self.timer: asyncio.TimerHandle | None = None
        self.delayed = False


class Batcher:
    """Queues requests for one engine and runs them in Triton-style dynamic batches.

    Parameters:
        execute: runs one batch; called by at most ``policy.instance_count`` at once.
        policy: the batching and queueing rules, usually ``BatchPolicy.from_config``.
        on_execution: called with ``(batch_size, compute_ns)`` after each successful
            execution (Triton counts only those); an exception from it is logged.
        clock: monotonic nanoseconds; every decision reads time from it.
    """

    def __init__(
        self,
        execute: Execute,
        policy: BatchPolicy,
        *,
        on_execution: Callable[[int, int], None] | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._execute = execute
        self._policy = policy
        self._on_execution = on_execution
        self._clock = clock
        self._batching = policy.max_batch_size > 0
        self._max_batch_size = policy.max_batch_size
        self._preferred = frozenset(policy.preferred_batch_sizes)
        self._max_preferred = max(policy.preferred_batch_sizes, default=0)
        self._delay_ns = policy.max_queue_delay_us * 1000
        self._queue_bound = policy.queue_bound
        policies = policy.priority_queue_policies if policy.priority_levels else {}
        self._levels = tuple(
            _Level(policies.get(level, policy.default_queue_policy))
            for level in range(1, max(policy.priority_levels, 1) + 1)
        )
        self._default_level = self._levels[max(policy.default_priority_level, 1) - 1]
        # The walk order: each level's unexpired requests, then its delayed ones.
        self._queues = tuple(
            (level, queue) for level in self._levels for queue in (level.queued, level.delayed)
        )
        self._pending = 0
        self._executing = 0
        self._wake = asyncio.Event()
        self._forming = asyncio.Lock()
        self._workers: list[asyncio.Task[None]] = []
        self._running: list[list[_Request] | None] = []
        self._closing = False
        self._drained = asyncio.Event()
        self._closed = asyncio.Event()

    @property
    def pending_count(self) -> int:
        """Requests queued and not yet in an execution."""
        return self._pending

    @property
    def executing_count(self) -> int:
        """Requests inside executions now."""
        return self._executing

    async def start(self) -> None:
        """Start one task per instance; a no-op when started or closing."""
        if self._workers or self._closing:
            return
        count = self._policy.instance_count
        self._running = [None] * count
        self._workers = [
            asyncio.create_task(self._serve(slot), name=f"batcher-instance-{slot}")
            for slot in range(count)
        ]

    async def submit(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        priority: int = 0,
        timeout_us: int = 0,
        request_id: str | None = None,
    ) -> BatchedResult:
        """Queue one request and return its share of the execution it joins.

        With batching on, dim 0 of the inputs is the request's batch size; inputs come
        validated (same dim 0, at least 1 and at most ``max_batch_size``). Cancelling the
        caller takes a queued request out of the queue, or drops its result.

        Raises:
            ServerStoppingError: :meth:`close` has begun.
            QueueFullError: the level is at ``max_queue_size`` or the queue at its bound.
            RequestTimeoutError: the queue timeout passed (REJECT policy).
            InternalError: the engine failed or returned outputs of the wrong batch size;
                a ``ZeroserveError`` from the engine passes through as it is.
        """
        if self._closing:
            raise ServerStoppingError()
        levels = self._levels
        level = levels[priority - 1] if 0 < priority <= len(levels) else self._default_level
        if self._pending >= self._queue_bound or 0 < level.max_size <= level.size:
            raise QueueFullError(request_id=request_id)
        rows = 0
        shapes = None
        if self._batching:
            shapes = {name: array.shape[1:] for name, array in inputs.items()}
            for array in inputs.values():
                rows = array.shape[0]
                break
            if rows > self._max_batch_size:
                raise InvalidArgumentError(
                    f"{request_prefix(request_id)}inference request batch-size must be "
                    f"<= {self._max_batch_size}"
                )
        now = self._clock()
        timeout_ns = level.timeout_ns
        if level.can_override and 0 < timeout_us * 1000 < timeout_ns:
            timeout_ns = timeout_us * 1000
        loop = asyncio.get_running_loop()
        request = _Request(
            inputs,
            rows,
            shapes,
            loop.create_future(),
            now,
            now + timeout_ns if timeout_ns else 0,
            level,
            request_id,
        )
        level.queued.append(request)
        level.size += 1
        self._pending += 1
        if timeout_ns and level.rejects:
            request.timer = loop.call_later(timeout_ns / 1e9, self._expire, request)
        self._wake.set()
        try:
            return await request.future
        except asyncio.CancelledError:
            if request.state == _QUEUED:
                self._withdraw(request)
            raise

    async def close(self, *, timeout_s: float) -> None:
        """Stop taking requests, drain for up to ``timeout_s``, then fail what is left.

        New submits raise ServerStoppingError at once. Queued requests are sent without
        waiting for fuller batches. After ``timeout_s`` the instance tasks are cancelled
        (their executions' requests fail with ServerStoppingError) and awaited for up to
        ``timeout_s`` more; requests still queued fail the same way. Idempotent: a later
        call waits (up to its own ``timeout_s``) for the first to finish.
        """
        if self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._closed.wait()
            return
        self._closing = True
        self._wake.set()
        if self._workers:
            self._check_drained()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._drained.wait()
            except TimeoutError:
                logger.warning(
                    "batcher drain timed out after %s s with %d queued and %d executing",
                    timeout_s,
                    self._pending,
                    self._executing,
                )
            for worker in self._workers:
                worker.cancel()
            _, stuck = await asyncio.wait(self._workers, timeout=timeout_s)
            if stuck:
                logger.error(
                    "%d batcher instance(s) did not stop within %s s of cancellation; "
                    "their engine ignores cancellation",
                    len(stuck),
                    timeout_s,
                )
        stopping = ServerStoppingError()
        for batch in self._running:
            for request in batch or ():
                _fail(request.future, stopping)
        for level, queue in self._queues:
            for request in queue:
                if request.state == _QUEUED:
                    self._discard(request)
                    _fail(request.future, stopping)
            queue.clear()
            level.dead = 0
        self._closed.set()

    async def _serve(self, slot: int) -> None:
        """One instance: take the next batch, run it, repeat."""
        task = self._workers[slot]
        # The loop test matters only for an engine that swallowed close's cancellation:
        # once it returns, the instance stops instead of idling forever.
        while not self._closed.is_set():
            batch = await self._next_batch()
            self._running[slot] = batch
            self._executing += len(batch)
            try:
                await self._run(batch, task)
            finally:
                self._running[slot] = None
                self._executing -= len(batch)
                if self._closing:
                    self._check_drained()

    async def _next_batch(self) -> list[_Request]:
        # One idle instance at a time forms a batch; the others queue on the lock and
        # take their turn as soon as it has one, so each instance takes the next batch.
        async with self._forming:
            while True:
                batch, wait_ns = self._form(self._clock())
                if batch is not None:
                    return batch
                self._wake.clear()
                if wait_ns < 0:
                    # Nothing queued: only a submit brings work (close cancels this task),
                    # so a timeout here would only poll.
                    await self._wake.wait()
                else:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait_ns / 1e9):
                            await self._wake.wait()

    def _form(self, now: int) -> tuple[list[_Request] | None, int]:
        """Take the next batch off the queue, as Triton's ``GetDynamicBatch`` decides.

        Returns ``(batch, 0)`` to execute now, ``(None, ns)`` to look again after ``ns``
        or at the next arrival, and ``(None, -1)`` when nothing is queued. With batching
        off the same walk yields one request: every size exceeds a maximum of 0.
        """
        taken: list[_Request] = []
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
                if request.state != _QUEUED:
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
                        _fail(request.future, RequestTimeoutError(request_id=request.request_id))
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
            send_now
            or pending >= max_preferred
            or is_delay_exceeded
            or not delay_ns
            or self._closing
        ):
            # Triton also wakes at the closest queue deadline; here REJECT timers fire on
            # their own and the walk that sends the batch applies DELAY, so only the
            # delay (and arrivals) can change the decision.
            self._restore(taken)
            return None, delay_ns - (now - oldest)
        for request in taken:
            request.state = _TAKEN
            request.level.size -= 1
            if request.timer is not None:
                request.timer.cancel()
        self._pending -= len(taken)
        return taken, 0

    def _restore(self, requests: list[_Request]) -> None:
        """Put walked requests back at the heads they came from, in their order."""
        for request in reversed(requests):
            level = request.level
            (level.delayed if request.delayed else level.queued).appendleft(request)

    async def _run(self, batch: list[_Request], task: asyncio.Task[None]) -> None:
        error: ZeroserveError
        try:
            inputs = batch[0].inputs if len(batch) == 1 else _concatenate(batch)
            started = self._clock()
            outputs = await self._execute(inputs)
            compute_ns = self._clock() - started
            shares = self._split(batch, outputs) if self._batching else [outputs]
        except asyncio.CancelledError:
            if task.cancelling():
                _fail_all(batch, ServerStoppingError())
                raise
            # The engine's own await was cancelled (an executor shut down under it).
            error = InternalError("the engine cancelled the execution")
        except ZeroserveError as exc:
            error = exc
        except Exception as exc:
            logger.error("engine failed on a batch of %d requests", len(batch), exc_info=exc)
            error = InternalError(str(exc) or type(exc).__name__)
            error.__cause__ = exc
        else:
            batch_size = sum(request.size for request in batch)
            for request, share in zip(batch, shares, strict=True):
                _resolve(
                    request.future,
                    BatchedResult(share, started - request.enqueue_ns, compute_ns, batch_size),
                )
            if self._on_execution is not None:
                try:
                    self._on_execution(batch_size, compute_ns)
                except Exception:
                    logger.exception("on_execution callback failed")
            return
        _fail_all(batch, error)

    @staticmethod
    def _split(
        batch: list[_Request], outputs: dict[str, np.ndarray]
    ) -> list[dict[str, np.ndarray]]:
        rows = sum(request.rows for request in batch)
        for name, array in outputs.items():
            if array.shape[:1] != (rows,):
                raise InternalError(
                    f"engine returned output '{name}' with shape {list(array.shape)} for a "
                    f"batch of {rows} rows"
                )
        if len(batch) == 1:
            return [outputs]
        shares = []
        start = 0
        for request in batch:
            end = start + request.rows
            shares.append({name: array[start:end] for name, array in outputs.items()})
            start = end
        return shares

    def _expire(self, request: _Request) -> None:
        """A REJECT request's timer: fail it if the clock agrees its deadline passed."""
        now = self._clock()
        if now < request.deadline_ns:
            # The loop's timer ran ahead of the injected clock; look again when it is due.
            request.timer = request.future.get_loop().call_later(
                (request.deadline_ns - now) / 1e9, self._expire, request
            )
            return
        request.timer = None
        self._withdraw(request)
        _fail(request.future, RequestTimeoutError(request_id=request.request_id))

    def _withdraw(self, request: _Request) -> None:
        """Take a queued request out wherever it is; its deque entry becomes a tombstone."""
        self._discard(request)
        level = request.level
        level.dead += 1
        if level.dead > _COMPACT_AT and level.dead > level.size:
            # Rebuild once tombstones outnumber live requests: O(1) amortized per
            # withdrawal, and a storm of cancellations cannot grow the deques unbounded.
            for queue in (level.queued, level.delayed):
                live = [r for r in queue if r.state == _QUEUED]
                queue.clear()
                queue.extend(live)
            level.dead = 0

    def _discard(self, request: _Request) -> None:
        """Account for a queued request that leaves without executing."""
        request.state = _GONE
        request.level.size -= 1
        self._pending -= 1
        if request.timer is not None:
            request.timer.cancel()
            request.timer = None
        if self._closing:
            self._check_drained()

    def _check_drained(self) -> None:
        if not self._pending and not self._executing:
            self._drained.set()


def _concatenate(batch: list[_Request]) -> dict[str, np.ndarray]:
    # Requests of one batch have the same input names and non-batch shapes (the walk's
    # shape check), so dim 0 concatenation is always defined.
    return {
        name: np.concatenate([request.inputs[name] for request in batch])
        for name in batch[0].inputs
    }


def _resolve(future: asyncio.Future[BatchedResult], result: BatchedResult) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[BatchedResult], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _fail_all(batch: list[_Request], error: BaseException) -> None:
    for request in batch:
        _fail(request.future, error)
