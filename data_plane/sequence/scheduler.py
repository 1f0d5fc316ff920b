"""The `SequenceBatcher`: a sequence model's requests, routed to their sequences' slots.

Owns what is common to both strategies: the checks a request meets before it is queued
(Triton's texts), the :class:`SequenceTable` and its lanes, the reaper (idle sequences and
backlog timeouts, read from the injected clock), the bounds on queued requests, and draining
on close. It answers the same calls as the dynamic :class:`Batcher` (``start``, ``submit``,
``close``, ``pending_count``, ``executing_count``), so a model version holds either; the
request's correlation ID and flags come in its :class:`RequestContext`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from data_plane.batcher import BatchedResult, Batcher, BatchPolicy, Execute, ExecuteRequests
from data_plane.errors import ServerStoppingError
from data_plane.sequence.controls import ControlTensors
from data_plane.sequence.direct import DirectLane
from data_plane.sequence.errors import (
    MissingCorrelationIdError,
    SequenceBacklogFullError,
    SequenceBatchSizeError,
    SequenceTimeoutError,
)
from data_plane.sequence.execution import Engine
from data_plane.sequence.oldest import OldestLane
from data_plane.sequence.policy import SequencePolicy
from data_plane.sequence.queued import SequenceRequest, fail
from data_plane.sequence.state import read_states
from data_plane.sequence.table import START, Run, SequenceTable, Slot, correlation_id_of
from foundation.proto.model_config_pb2 import ModelConfig
from runtimes.model_request import RequestContext

logger = logging.getLogger(__name__)

_NO_CONTEXT = RequestContext()


class SequenceBatcher:
    """Schedules a sequence model's requests by correlation ID (Triton's sequence batcher).

    Parameters:
        execute: runs one merged batch (``ModelRuntime.infer``).
        policy: the rules from the model's config (``SequencePolicy.from_config``).
        on_execution: called with ``(batch_size, compute_ns)`` after each successful
            execution; an exception from it is logged.
        execute_requests: given, batches go to it as separate requests instead.
        clock: monotonic nanoseconds; every decision reads time from it.
    """

    def __init__(
        self,
        execute: Execute,
        policy: SequencePolicy,
        *,
        on_execution: Callable[[int, int], None] | None = None,
        execute_requests: ExecuteRequests | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._policy = policy
        self._clock = clock
        self._batching = policy.max_batch_size > 0
        slots = [
            Slot(index, lane)
            for lane in range(policy.lanes)
            for index in range(policy.slots_per_lane)
        ]
        self._table: SequenceTable[SequenceRequest] = SequenceTable(
            policy.model, slots, idle_us=policy.idle_us, max_backlog=policy.queue_bound
        )
        controls = ControlTensors(policy.controls, batching=self._batching)
        self._lanes: list[DirectLane | OldestLane]
        if policy.strategy == "direct":
            engine = Engine(execute, execute_requests, batching=self._batching)
            self._lanes = [
                DirectLane(
                    lane,
                    policy,
                    self._table,
                    engine,
                    controls,
                    clock,
                    on_execution=on_execution,
                    on_slot_given=self._slot_given,
                    on_dequeue=self._dequeued,
                    on_executed=self._check_drained,
                )
                for lane in range(policy.lanes)
            ]
        else:
            batch_policy = BatchPolicy(
                max_batch_size=policy.max_batch_size,
                preferred_batch_sizes=policy.preferred_batch_sizes,
                max_queue_delay_us=policy.max_queue_delay_us,
                queue_bound=policy.queue_bound,
            )
            self._lanes = [
                OldestLane(
                    lane,
                    policy,
                    self._table,
                    Batcher(
                        execute,
                        batch_policy,
                        on_execution=on_execution,
                        clock=clock,
                        execute_requests=execute_requests,
                    ),
                    controls,
                    takes_requests=execute_requests is not None,
                    on_slot_given=self._slot_given,
                    on_dequeue=self._dequeued,
                    on_executed=self._check_drained,
                )
                for lane in range(policy.lanes)
            ]
        self._pending = 0
        self._reaper: asyncio.Task[None] | None = None
        self._reaper_wake = asyncio.Event()
        self._reaper_due_us = -1
        """When the reaper next looks by itself (-1: it waits to be woken)."""
        self._is_started = False
        self._closing = False
        self._drained = asyncio.Event()
        self._closed = asyncio.Event()

    @property
    def policy(self) -> SequencePolicy:
        return self._policy

    @property
    def pending_count(self) -> int:
        """Requests queued (in slots or the backlog), not yet executing."""
        return self._pending

    @property
    def executing_count(self) -> int:
        """Requests inside executions now."""
        return sum(lane.executing for lane in self._lanes)

    @property
    def live_sequences(self) -> int:
        """Sequences started and not yet ended (by END or the idle timeout), backlogged ones
        included: what must not be cut by unloading the model."""
        return self._table.live

    async def start(self) -> None:
        """Start the lanes and the reaper; a no-op when started or closing."""
        if self._is_started or self._closing:
            return
        self._is_started = True
        for lane in self._lanes:
            await lane.start()
        self._reaper = asyncio.create_task(
            self._reap(), name=f"sequence-reaper-{self._policy.model}"
        )

    async def submit(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        priority: int = 0,
        timeout_us: int = 0,
        request_id: str | None = None,
        context: RequestContext | None = None,
    ) -> BatchedResult:
        """Queue one request in its sequence and return its outputs once it has run.

        ``context`` carries the correlation ID (``sequence_id``) and the START/END flags.
        ``timeout_us`` bounds only the time its sequence may wait in the backlog;
        ``priority`` is not used by the sequence batcher (nor by Triton's).

        Raises:
            ServerStoppingError: :meth:`close` has begun.
            SequenceBatchSizeError: more than one row to a batching model.
            MissingCorrelationIdError: no correlation ID.
            SequenceNotStartedError: no START and no sequence of that ID running.
            SequenceBacklogFullError: the queues are at their bound.
            SequenceTimeoutError: the backlog timeout ran out.
            SequenceCancelledError: an earlier request of the sequence was cancelled.
            what the engine raised, as the dynamic batcher passes it on.
        """
        del priority
        policy = self._policy
        if self._closing:
            raise ServerStoppingError()
        if self._batching:
            for array in inputs.values():
                if array.shape[0] > 1:
                    raise SequenceBatchSizeError(model=policy.model)
                break
        context = context or _NO_CONTEXT
        correlation_id = correlation_id_of(context.correlation_id)
        if correlation_id is None:
            raise MissingCorrelationIdError(model=policy.model)
        if self._pending >= policy.queue_bound:
            raise SequenceBacklogFullError(model=policy.model, request_id=request_id)
        now = self._clock()
        request = SequenceRequest(
            inputs,
            correlation_id,
            context.flags,
            asyncio.get_running_loop().create_future(),
            now,
            request_id,
            context,
        )
        admission = self._table.admit(
            correlation_id, context.flags, request, now_us=now // 1000, timeout_us=timeout_us
        )
        self._pending += 1
        run = admission.run
        if not admission.is_new and context.flags & START:
            logger.warning(
                "sequence %s for model '%s' has a conflict: the previous sequence did not end "
                "before this sequence start; it continues with this request",
                correlation_id,
                policy.model,
            )
        elif admission.is_new and run.slot is None:
            logger.debug("sequence %s of %s waits for a slot", correlation_id, policy.model)
        self._route(run, is_new_slot=admission.has_new_slot)
        if admission.has_new_slot:
            self._wake_reaper_by(now // 1000 + policy.idle_us)
        elif run.slot is None and timeout_us:
            self._wake_reaper_by(run.expires_us)
        return await request.future

    def _wake_reaper_by(self, due_us: int) -> None:
        """Wake the reaper if ``due_us`` comes before what it waits for: each wake scans
        every live sequence, so it is not woken for what it will see in time anyway."""
        if self._reaper_due_us < 0 or due_us < self._reaper_due_us:
            self._reaper_due_us = due_us
            self._reaper_wake.set()

    def _route(self, run: Run[SequenceRequest], *, is_new_slot: bool) -> None:
        slot = run.slot
        if slot is None:
            return
        lane = self._lanes[slot.lane]
        if is_new_slot:
            lane.assign(run)
        elif isinstance(lane, DirectLane):
            lane.kick()
        else:
            lane.kick(run)

    def _slot_given(self, run: Run[SequenceRequest]) -> None:
        """A lane gave a backlogged run its slot: the reaper now watches its idleness
        (counted from its last request, which may be long past)."""
        self._wake_reaper_by(run.last_seen_us + self._policy.idle_us)

    def _dequeued(self, count: int) -> None:
        self._pending -= count
        self._check_drained()

    def _check_drained(self) -> None:
        if self._closing and self._is_drained():
            self._drained.set()

    async def close(self, *, timeout_s: float) -> None:
        """Stop taking requests, let queued ones run for up to ``timeout_s``, then fail
        what is left with ServerStoppingError and stop the lanes and the reaper.

        Sequences still waiting for a slot when the drain ends fail too: a sequence that
        never sends END holds its slot until the idle timeout. Idempotent: a later call
        waits (up to its own ``timeout_s``) for the first to finish.
        """
        if self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._closed.wait()
            return
        self._closing = True
        self._check_drained()
        try:
            async with asyncio.timeout(timeout_s):
                await self._drained.wait()
        except TimeoutError:
            logger.warning(
                "sequence batcher of %s: drain timed out after %s s with %d queued and %d "
                "executing",
                self._policy.model,
                timeout_s,
                self._pending,
                self.executing_count,
            )
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for lane in self._lanes:
            await lane.stop(timeout_s=timeout_s)
        stopping = ServerStoppingError()
        for lane in self._lanes:
            lane.fail_queued(stopping)
        for run in self._table.drain_backlog():
            self._fail_run(run, stopping)
        self._closed.set()

    def _is_drained(self) -> bool:
        # Backlogged requests wait on slots that only their sequences' ends free, so a
        # drain waits for what the slots hold and what runs.
        return not self.executing_count and all(lane.is_idle for lane in self._lanes)

    def _fail_run(self, run: Run[SequenceRequest], error: BaseException) -> None:
        self._pending -= len(run.queue)
        while run.queue:
            fail(run.queue.popleft(), error)

    async def _reap(self) -> None:
        """End idle sequences and fail timed-out backlogs, waking when the next is due."""
        while True:
            self._reaper_wake.clear()
            now_us = self._clock() // 1000
            ended, idle_due = self._table.reap_idle(now_us)
            for run in ended:
                logger.info(
                    "sequence %s of %s ended after %d us idle",
                    run.correlation_id,
                    self._policy.model,
                    self._policy.idle_us,
                )
                self._route(run, is_new_slot=False)
            expired, backlog_due = self._table.expire_backlog(now_us)
            timeout = SequenceTimeoutError()
            for run in expired:
                self._fail_run(run, timeout)
            dues = [due for due in (idle_due, backlog_due) if due >= 0]
            self._reaper_due_us = min(dues, default=-1)
            if not dues:
                await self._reaper_wake.wait()
                continue
            wait_us = max(min(dues) - now_us, 0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_us / 1e6):
                    await self._reaper_wake.wait()


async def create_sequence_batcher(
    config: ModelConfig,
    model_dir: Path,
    execute: Execute,
    *,
    instance_count: int,
    queue_bound: int,
    on_execution: Callable[[int, int], None] | None = None,
    execute_requests: ExecuteRequests | None = None,
) -> SequenceBatcher:
    """A started sequence batcher for a normalized ``config`` with ``sequence_batching``,
    its initial states read from ``model_dir`` (off the event loop). Raises ModelLoadError
    with Triton's reason for a state Triton refuses."""
    states = await asyncio.to_thread(read_states, config, model_dir)
    policy = SequencePolicy.from_config(
        config, instance_count=instance_count, states=states, queue_bound=queue_bound
    )
    batcher = SequenceBatcher(
        execute, policy, on_execution=on_execution, execute_requests=execute_requests
    )
    await batcher.start()
    return batcher
