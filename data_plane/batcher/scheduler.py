"""The `Batcher`: takes requests, runs batches on one task per instance, hands out results.

Owns the dynamic batcher's concurrency: the instance tasks and the lock under which an idle
instance forms its batch, the REJECT timeout timers, running a batch on the engine and
splitting its outputs into each request's rows, the ``on_execution`` statistics callback, and
draining on close. The queue and the batch-forming walk are `queue`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np

from data_plane.batcher.policy import BatchPolicy
from data_plane.batcher.queue import QUEUED, BatchedResult, QueuedRequest, RequestQueue, fail_future
from data_plane.errors import (
    InternalError,
    InvalidArgumentError,
    QueueFullError,
    RequestTimeoutError,
    ServerStoppingError,
    ZeroserveError,
    request_prefix,
)
from runtimes.model_request import ModelRequest, RequestContext, RequestOutcome

# The package's name, as the logger was named before the batcher became a package.
logger = logging.getLogger("data_plane.batcher")


class Execute(Protocol):
    """Runs one batch on the engine; ``ModelRuntime.infer`` is one."""

    async def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class ExecuteRequests(Protocol):
    """Runs one batch as its separate requests, one outcome each;
    ``RequestExecutor.execute_requests`` is one."""

    async def __call__(self, requests: Sequence[ModelRequest]) -> list[RequestOutcome]: ...


_NO_CONTEXT = RequestContext()


class Batcher:
    """Queues requests for one engine and runs them in Triton-style dynamic batches.

    Parameters:
        execute: runs one batch; called by at most ``policy.instance_count`` at once.
        policy: the batching and queueing rules, usually ``BatchPolicy.from_config``.
        on_execution: called with ``(batch_size, compute_ns)`` after each successful
            execution (Triton counts only those); an exception from it is logged.
        execute_requests: given, it runs every batch instead of ``execute``, with each
            request's own inputs and context (rows are not merged), and each request gets
            its own outputs or its own error.
        clock: monotonic nanoseconds; every decision reads time from it.
    """

    def __init__(
        self,
        execute: Execute,
        policy: BatchPolicy,
        *,
        on_execution: Callable[[int, int], None] | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        execute_requests: ExecuteRequests | None = None,
    ) -> None:
        self._execute = execute
        self._execute_requests = execute_requests
        self._policy = policy
        self._on_execution = on_execution
        self._clock = clock
        self._batching = policy.max_batch_size > 0
        self._max_batch_size = policy.max_batch_size
        self._queue_bound = policy.queue_bound
        self._queue = RequestQueue(policy, on_discard=self._after_discard)
        self._executing = 0
        self._wake = asyncio.Event()
        self._forming = asyncio.Lock()
        self._workers: list[asyncio.Task[None]] = []
        self._running: list[list[QueuedRequest] | None] = []
        self._closing = False
        self._drained = asyncio.Event()
        self._closed = asyncio.Event()

    @property
    def pending_count(self) -> int:
        """Requests queued and not yet in an execution."""
        return self._queue.pending

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
        context: RequestContext | None = None,
    ) -> BatchedResult:
        """Queue one request and return its share of the execution it joins.

        With batching on, dim 0 of the inputs is the request's batch size; inputs come
        validated (same dim 0, at least 1 and at most ``max_batch_size``). Cancelling the
        caller takes a queued request out of the queue, or drops its result. ``context``
        reaches ``execute_requests`` with the inputs (the request's id, parameters,
        requested outputs).

        Raises:
            ServerStoppingError: :meth:`close` has begun.
            QueueFullError: the level is at ``max_queue_size`` or the queue at its bound.
            RequestTimeoutError: the queue timeout passed (REJECT policy).
            InternalError: the engine failed or returned outputs of the wrong batch size;
                a ``ZeroserveError`` from the engine passes through as it is.
        """
        if self._closing:
            raise ServerStoppingError()
        level = self._queue.level_for(priority)
        if self._queue.pending >= self._queue_bound or 0 < level.max_size <= level.size:
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
        request = QueuedRequest(
            inputs,
            rows,
            shapes,
            loop.create_future(),
            now,
            now + timeout_ns if timeout_ns else 0,
            level,
            request_id,
            context,
        )
        self._queue.push(request)
        if timeout_ns and level.rejects:
            request.timer = loop.call_later(timeout_ns / 1e9, self._expire, request)
        self._wake.set()
        try:
            return await request.future
        except asyncio.CancelledError:
            if request.state == QUEUED:
                self._queue.withdraw(request)
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
                    self._queue.pending,
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
                fail_future(request.future, stopping)
        self._queue.fail_queued(stopping)
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
                if self._execute_requests is not None:
                    await self._run_requests(batch, task, self._execute_requests)
                else:
                    await self._run(batch, task)
            finally:
                self._running[slot] = None
                self._executing -= len(batch)
                if self._closing:
                    self._check_drained()

    async def _next_batch(self) -> list[QueuedRequest]:
        # One idle instance at a time forms a batch; the others queue on the lock and
        # take their turn as soon as it has one, so each instance takes the next batch.
        async with self._forming:
            while True:
                batch, wait_ns = self._queue.form(self._clock(), closing=self._closing)
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

    async def _run(self, batch: list[QueuedRequest], task: asyncio.Task[None]) -> None:
        error: ZeroserveError
        try:
            exec_start = self._clock()
            inputs = batch[0].inputs if len(batch) == 1 else _concatenate(batch)
            started = self._clock()
            outputs = await self._execute(inputs)
            compute_ns = self._clock() - started
            shares = self._split(batch, outputs) if self._batching else [outputs]
            exec_end = self._clock()
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
                    BatchedResult(
                        share,
                        started - request.enqueue_ns,
                        compute_ns,
                        batch_size,
                        started,
                        exec_start,
                        exec_end,
                    ),
                )
            if self._on_execution is not None:
                try:
                    self._on_execution(batch_size, compute_ns)
                except Exception:
                    logger.exception("on_execution callback failed")
            return
        _fail_all(batch, error)

    async def _run_requests(
        self, batch: list[QueuedRequest], task: asyncio.Task[None], execute: ExecuteRequests
    ) -> None:
        """Run ``batch`` as its separate requests: each gets its own outputs or error."""
        exec_start = self._clock()
        requests = [ModelRequest(r.inputs, _with_cancellation(r)) for r in batch]
        started = self._clock()
        try:
            outcomes = await execute(requests)
            if len(outcomes) != len(batch):
                raise InternalError(
                    f"engine returned {len(outcomes)} outcomes for {len(batch)} requests"
                )
        except asyncio.CancelledError:
            if task.cancelling():
                _fail_all(batch, ServerStoppingError())
                raise
            _fail_all(batch, InternalError("the engine cancelled the execution"))
            return
        except ZeroserveError as exc:
            _fail_all(batch, exc)
            return
        except Exception as exc:
            logger.error("engine failed on a batch of %d requests", len(batch), exc_info=exc)
            error = InternalError(str(exc) or type(exc).__name__)
            error.__cause__ = exc
            _fail_all(batch, error)
            return
        compute_ns = self._clock() - started
        exec_end = self._clock()
        batch_size = sum(request.size for request in batch)
        for request, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, ZeroserveError):
                fail_future(request.future, outcome)
                continue
            _resolve(
                request.future,
                BatchedResult(
                    outcome,
                    started - request.enqueue_ns,
                    compute_ns,
                    batch_size,
                    started,
                    exec_start,
                    exec_end,
                ),
            )
        if self._on_execution is not None:
            try:
                self._on_execution(batch_size, compute_ns)
            except Exception:
                logger.exception("on_execution callback failed")

    @staticmethod
    def _split(
        batch: list[QueuedRequest], outputs: dict[str, np.ndarray]
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

    def _expire(self, request: QueuedRequest) -> None:
        """A REJECT request's timer: fail it if the clock agrees its deadline passed."""
        now = self._clock()
        if now < request.deadline_ns:
            # The loop's timer ran ahead of the injected clock; look again when it is due.
            request.timer = request.future.get_loop().call_later(
                (request.deadline_ns - now) / 1e9, self._expire, request
            )
            return
        request.timer = None
        self._queue.withdraw(request)
        fail_future(request.future, RequestTimeoutError(request_id=request.request_id))

    def _after_discard(self) -> None:
        """The queue's ``on_discard``: a request that left may complete the drain."""
        if self._closing:
            self._check_drained()

    def _check_drained(self) -> None:
        if not self._queue.pending and not self._executing:
            self._drained.set()


def _with_cancellation(request: QueuedRequest) -> RequestContext:
    """The context a request reaches its engine with: cancelled once its caller stopped
    waiting (its future is done). A streamed request's future resolves when its execution
    ends, not when its client leaves: its context says itself when it is cancelled."""
    context = request.context or _NO_CONTEXT
    if context.responses is not None:
        return context
    return replace(context, is_cancelled=request.future.done)


def _concatenate(batch: list[QueuedRequest]) -> dict[str, np.ndarray]:
    # Requests of one batch have the same input names and non-batch shapes (the walk's
    # shape check), so dim 0 concatenation is always defined.
    return {
        name: np.concatenate([request.inputs[name] for request in batch])
        for name in batch[0].inputs
    }


def _resolve(future: asyncio.Future[BatchedResult], result: BatchedResult) -> None:
    if not future.done():
        future.set_result(result)


def _fail_all(batch: list[QueuedRequest], error: BaseException) -> None:
    for request in batch:
        fail_future(request.future, error)
