"""Per-model buffer of requests waiting for a ready replica.

A model's queue exists while it has requests waiting. The first request of a queue that
knows no replica starts one activation ("once per burst"); later arrivals join the queue
and wait. When replicas appear, each gets ``release_concurrency`` release slots: a waiter
leaves the queue with a :class:`Grant` for a replica that has a free slot, and its slot
comes back when the request finishes (:meth:`Grant.release`), letting the next one go. So
a fresh replica takes the backlog at the rate it answers, not all at once. Once the queue
is empty the model's requests go straight to its replicas again, without slots.

Each waiter has a deadline; an activation that raises or outlasts ``activation_timeout_s``
fails every waiter of its burst. The first response to a request of a burst that asked for
an activation is the cold start's first response; :meth:`Grant.responded` tells it apart.
Everything here runs on one event loop without locks: the methods that touch a queue never
await in between.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple, Protocol

from activator.errors import (
    ActivationFailedError,
    BufferFullError,
    ColdStartTimeoutError,
    ShuttingDownError,
)
from activator.lb import Replica
from foundation.errors import ModelFailedError

logger = logging.getLogger(__name__)

_COMPACT_SLACK = 16
"""Done waiters tolerated in a queue's deque beyond twice the live ones."""


class Activate(Protocol):
    """Asks the control plane to bring ``model`` up.

    Returns once the request is made (or, embedded, once the model is up); raises if the
    model cannot be activated. Readiness itself arrives as a placement, not as the return.
    """

    async def __call__(self, model: str) -> None: ...


class ReadyReplicas(Protocol):
    """The replicas a model has right now (to seed a new queue)."""

    def replicas(self, model: str) -> Sequence[Replica]: ...


class Grant:
    """A buffered request's turn on ``replica``. Call :meth:`release` when it finishes."""

    __slots__ = ("_buffer", "_is_released", "_queue", "replica")

    def __init__(self, buffer: Buffer, queue: _Queue, replica: Replica) -> None:
        self._buffer = buffer
        self._queue = queue
        self._is_released = False
        self.replica = replica

    def release(self) -> None:
        """Give the release slot back (idempotent); the next waiter may go."""
        if not self._is_released:
            self._is_released = True
            self._buffer._give_back(self._queue, self.replica)

    def responded(self) -> float | None:
        """Note that the request got its response (the status line arrived).

        For the first response of a burst that asked for an activation, the seconds since
        it asked: the cold start as the burst saw it, which the activator reports. None for
        every other response.
        """
        asked_at = self._queue.activation_asked_at
        if asked_at is None:
            return None
        self._queue.activation_asked_at = None
        return asyncio.get_running_loop().time() - asked_at


class _Waiter(NamedTuple):
    future: asyncio.Future[Grant]
    timer: asyncio.TimerHandle


class _Queue:
    """One model's waiting requests and the release slots of its replicas."""

    __slots__ = ("activation_asked_at", "is_activating", "model", "slots", "waiters", "waiting")

    def __init__(self, model: str, slots: dict[Replica, int]) -> None:
        self.model = model
        self.waiters: deque[_Waiter] = deque()
        """In order; may hold waiters already done (cancelled), skipped on release."""
        self.waiting = 0
        """Waiters not yet granted, failed or dropped: what the bound counts."""
        self.slots = slots
        """Free release slots per known replica."""
        self.is_activating = False
        """An activation was asked for this burst and no replica has answered it yet."""
        self.activation_asked_at: float | None = None
        """Event-loop time the burst asked for an activation, until a granted request of
        the burst got its response."""


class Buffer:
    """Holds requests for models without a ready replica, and releases them gradually.

    Parameters:
        activate: asks the control plane for a model; called once per burst.
        replicas: the current replicas of a model, read when its queue starts.
        max_requests: waiters one model may have; one more raises :class:`BufferFullError`.
        release_concurrency: buffered requests in flight at once per replica while the
            queue drains.
        activation_timeout_s: bound on one activation call; also the deadline named in
            :class:`ColdStartTimeoutError` messages.
        retry_after_s: carried by the errors this raises.
    """

    def __init__(
        self,
        activate: Activate,
        replicas: ReadyReplicas,
        *,
        max_requests: int,
        release_concurrency: int,
        activation_timeout_s: float,
        retry_after_s: int,
    ) -> None:
        self._activate = activate
        self._replicas = replicas
        self._max_requests = max_requests
        self._release_concurrency = release_concurrency
        self._activation_timeout_s = activation_timeout_s
        self._retry_after_s = retry_after_s
        self._queues: dict[str, _Queue] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._is_closed = False

    def is_waiting(self, model: str) -> bool:
        """Whether ``model`` has a queue; new requests then join it instead of overtaking."""
        return model in self._queues

    def would_activate(self, model: str) -> bool:
        """Whether a request for ``model`` now would start an activation: no replica, and
        no burst already waiting for one."""
        return model not in self._queues and not self._replicas.replicas(model)

    def waiting(self, model: str) -> int:
        """How many requests for ``model`` wait for a replica."""
        queue = self._queues.get(model)
        return queue.waiting if queue is not None else 0

    def depths(self) -> dict[str, int]:
        """How many requests wait per model, for the models that have a queue."""
        return {model: queue.waiting for model, queue in self._queues.items()}

    async def wait(self, model: str, *, deadline: float, requeue: bool = False) -> Grant:
        """Wait in ``model``'s queue until a replica has a slot, at most until ``deadline``
        (event-loop time).

        ``requeue`` is for a request whose granted replica vanished before it got the
        request: it goes to the front and is not refused for a full buffer, since it was
        admitted already.

        Raises:
            BufferFullError: the queue holds ``max_requests`` waiters.
            ColdStartTimeoutError: ``deadline`` passed first.
            ActivationFailedError: the burst's activation raised or timed out.
            ShuttingDownError: the buffer was closed.
        """
        if self._is_closed:
            raise ShuttingDownError(model=model, retry_after_s=self._retry_after_s)
        queue = self._queues.get(model)
        if queue is None:
            slots = dict.fromkeys(self._replicas.replicas(model), self._release_concurrency)
            queue = self._queues[model] = _Queue(model, slots)
        elif not requeue and queue.waiting >= self._max_requests:
            raise BufferFullError(
                model=model, limit=self._max_requests, retry_after_s=self._retry_after_s
            )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Grant] = loop.create_future()
        waiter = _Waiter(future, loop.call_at(deadline, self._expire, queue, future))
        if requeue:
            queue.waiters.appendleft(waiter)
        else:
            queue.waiters.append(waiter)
        queue.waiting += 1
        self._release(queue)
        self._maybe_activate(queue)
        try:
            return await future
        except asyncio.CancelledError:
            if future.cancelled():
                # Cancelled while waiting (the client went away): leave the queue.
                waiter.timer.cancel()
                self._left(queue)
            elif future.exception() is None:
                # Granted in the same loop turn as the cancellation: pass the slot on.
                future.result().release()
            raise

    def replica_added(self, model: str, replica: Replica) -> None:
        """A replica of ``model`` became ready: give it slots and release waiters to it."""
        queue = self._queues.get(model)
        if queue is None:
            return
        queue.slots[replica] = self._release_concurrency
        queue.is_activating = False
        self._release(queue)

    def replica_removed(self, model: str, replica: Replica) -> None:
        """A replica of ``model`` is gone: drop its slots; with none left, activate again."""
        queue = self._queues.get(model)
        if queue is None or queue.slots.pop(replica, None) is None:
            return
        self._maybe_activate(queue)

    async def close(self) -> None:
        """Stop activations and fail every waiter with :class:`ShuttingDownError`."""
        self._is_closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for queue in self._queues.values():
            self._fail_all(
                queue,
                partial(ShuttingDownError, model=queue.model, retry_after_s=self._retry_after_s),
            )
        self._queues.clear()

    def _release(self, queue: _Queue) -> None:
        while queue.waiters:
            waiter = queue.waiters[0]
            if waiter.future.done():
                queue.waiters.popleft()
                continue
            replica = _most_free(queue.slots)
            if replica is None:
                break
            queue.waiters.popleft()
            queue.slots[replica] -= 1
            waiter.timer.cancel()
            queue.waiting -= 1
            waiter.future.set_result(Grant(self, queue, replica))
        self._discard_if_idle(queue)

    def _give_back(self, queue: _Queue, replica: Replica) -> None:
        if self._queues.get(queue.model) is not queue or replica not in queue.slots:
            return
        queue.slots[replica] += 1
        self._release(queue)

    def _expire(self, queue: _Queue, future: asyncio.Future[Grant]) -> None:
        if future.done():
            # Cancelled in this loop turn; the waiting task has yet to see it.
            return
        future.set_exception(
            ColdStartTimeoutError(
                model=queue.model,
                timeout_s=self._activation_timeout_s,
                retry_after_s=self._retry_after_s,
            )
        )
        self._left(queue)

    def _maybe_activate(self, queue: _Queue) -> None:
        if queue.slots or queue.is_activating:
            return
        queue.is_activating = True
        if queue.activation_asked_at is None:
            queue.activation_asked_at = asyncio.get_running_loop().time()
        task = asyncio.create_task(self._activate_once(queue), name=f"activate-{queue.model}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _activate_once(self, queue: _Queue) -> None:
        logger.info("activating %s for %d waiting requests", queue.model, queue.waiting)
        try:
            async with asyncio.timeout(self._activation_timeout_s):
                await self._activate(queue.model)
        except Exception as exc:
            reason = (
                f"the activation call took longer than {self._activation_timeout_s:g} s"
                if isinstance(exc, TimeoutError)
                else str(exc) or type(exc).__name__
            )
            logger.warning("activation of %s failed: %s", queue.model, reason)
            queue.is_activating = False
            # Fail only the burst this activation was for, and only while it has no replica.
            if self._queues.get(queue.model) is queue and not queue.slots:
                error: Callable[[], Exception]
                if isinstance(exc, ModelFailedError):
                    # Passed on as it is: a failure for good, which no retry mends.
                    error = partial(
                        ModelFailedError,
                        model=exc.model,
                        reason=exc.reason,
                        failed_at=exc.failed_at,
                    )
                else:
                    error = partial(
                        ActivationFailedError,
                        model=queue.model,
                        reason=reason,
                        retry_after_s=max(self._retry_after_s, _retry_after(exc)),
                    )
                self._fail_all(queue, error)
                self._discard_if_idle(queue)

    def _fail_all(self, queue: _Queue, error: Callable[[], Exception]) -> None:
        while queue.waiters:
            waiter = queue.waiters.popleft()
            if not waiter.future.done():
                waiter.timer.cancel()
                queue.waiting -= 1
                waiter.future.set_exception(error())

    def _left(self, queue: _Queue) -> None:
        """A waiter left out of turn (deadline, cancellation); it stays in the deque, done,
        until it reaches the front. Rebuild the deque when such leftovers dominate it, so
        that a model without replicas and a steady trickle of abandoned requests does not
        grow it without bound."""
        queue.waiting -= 1
        if len(queue.waiters) > 2 * queue.waiting + _COMPACT_SLACK:
            queue.waiters = deque(w for w in queue.waiters if not w.future.done())
        self._discard_if_idle(queue)

    def _discard_if_idle(self, queue: _Queue) -> None:
        if queue.waiting == 0 and self._queues.get(queue.model) is queue:
            del self._queues[queue.model]


def _retry_after(exc: Exception) -> int:
    """The ``retry_after_s`` an activation's error carries (the control plane's backoff
    says when its next activation may start), else 0."""
    value = getattr(exc, "retry_after_s", 0)
    return value if isinstance(value, int) else 0


def _most_free(slots: dict[Replica, int]) -> Replica | None:
    """The replica with the most free slots, or None when none has one."""
    best: Replica | None = None
    best_free = 0
    for replica, free in slots.items():
        if free > best_free:
            best, best_free = replica, free
    return best
