"""The direct strategy: one lane's slots batched row by row (Triton's ``DirectSequenceBatch``).

A lane runs one execution at a time. Each holds, for every slot from 0 to the highest with
a request waiting, that slot's next request, or a filler row (READY false, CORRID 0, zeros)
where the slot has none, so that a sequence's requests always take the same row. With
``max_queue_delay_microseconds`` and ``minimum_slot_utilization`` both set, a batch waits
until that share of the slots has a request or its oldest request has waited the delay.

Before forming a batch the lane settles its slots: a sequence whose next request was
cancelled ends (Triton's rule: its queued requests fail, its slot frees), and a slot whose
sequence is done goes to the oldest backlogged one. For a model whose requests are merged
into one batch, a request whose tensors' shapes differ from the first one's waits for a
later batch (a filler row stands in for it), since rows of different shapes cannot be
concatenated; a model taking separate requests gets them as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from data_plane.batcher import BatchedResult
from data_plane.errors import InternalError, ServerStoppingError, ZeroserveError
from data_plane.sequence.controls import ControlTensors, Row
from data_plane.sequence.errors import SequenceCancelledError
from data_plane.sequence.execution import BatchRow, Engine, filler_inputs
from data_plane.sequence.policy import SequencePolicy
from data_plane.sequence.queued import SequenceRequest, current_state, fail, resolve, state_of
from data_plane.sequence.state import StateSpec, initial_inputs
from data_plane.sequence.table import START, Run, SequenceTable
from runtimes.model_request import RequestContext, RequestOutcome

logger = logging.getLogger(__name__)

_NO_CONTEXT = RequestContext()


class DirectLane:
    """One lane of a direct-strategy batcher: its slots and the task running their batches.

    Parameters:
        index: the lane's number (its slots' ``Slot.lane``).
        policy: the model's sequence policy.
        table: the batcher's sequence table (shared by its lanes).
        engine: runs a batch.
        controls: builds the control tensors.
        clock: monotonic nanoseconds.
        on_execution: called with ``(rows, compute_ns)`` after each successful execution.
        on_slot_given: called with a backlogged run this lane gave a slot.
        on_dequeue: called with the number of requests that left the queues.
        on_executed: called after each execution has ended.
    """

    def __init__(
        self,
        index: int,
        policy: SequencePolicy,
        table: SequenceTable[SequenceRequest],
        engine: Engine,
        controls: ControlTensors,
        clock: Callable[[], int],
        *,
        on_execution: Callable[[int, int], None] | None,
        on_slot_given: Callable[[Run[SequenceRequest]], None],
        on_dequeue: Callable[[int], None],
        on_executed: Callable[[], None],
    ) -> None:
        self.index = index
        self._policy = policy
        self._table = table
        self._engine = engine
        self._controls = controls
        self._clock = clock
        self._on_execution = on_execution
        self._on_slot_given = on_slot_given
        self._on_dequeue = on_dequeue
        self._on_executed = on_executed
        self._runs: list[Run[SequenceRequest] | None] = [None] * policy.slots_per_lane
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.executing = 0
        self.closing = False

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._serve(), name=f"sequence-direct-{self.index}")

    def assign(self, run: Run[SequenceRequest]) -> None:
        """``run`` was given one of this lane's slots."""
        slot = run.slot
        if slot is None or slot.lane != self.index:
            raise ValueError("the run holds no slot of this lane")
        self._runs[slot.index] = run
        self._wake.set()

    def kick(self) -> None:
        """A run of this lane has a new request, or may be done."""
        self._wake.set()

    @property
    def is_idle(self) -> bool:
        """Nothing queued in its slots and nothing executing."""
        return not self.executing and not any(run and run.queue for run in self._runs)

    async def stop(self, *, timeout_s: float) -> None:
        """Cancel the lane's task (its execution's requests fail) and wait for it."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._task

    def fail_queued(self, error: BaseException) -> None:
        """Fail every request still in this lane's slots."""
        for run in self._runs:
            if run is None:
                continue
            self._on_dequeue(len(run.queue))
            while run.queue:
                fail(run.queue.popleft(), error)

    async def _serve(self) -> None:
        while True:
            rows = await self._next_batch()
            await self._execute(rows)

    async def _next_batch(self) -> list[_Row]:
        policy = self._policy
        delay_ns = policy.max_queue_delay_us * 1000
        utilization = policy.minimum_slot_utilization
        while True:
            self._wake.clear()
            self._settle()
            fronts = [(i, run) for i, run in enumerate(self._runs) if run is not None and run.queue]
            if not fronts:
                await self._wake.wait()
                continue
            if delay_ns and utilization and not self.closing:
                now = self._clock()
                age = now - min(run.queue[0].enqueue_ns for _, run in fronts)
                share = len(fronts) / max(1, policy.max_batch_size)
                if age <= delay_ns and share < utilization:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout((delay_ns - age) / 1e9):
                            await self._wake.wait()
                    continue
            return self._form(fronts[-1][0])

    def _settle(self) -> None:
        """End sequences whose next request was cancelled; free the slots of done runs."""
        for i in range(len(self._runs)):
            run = self._runs[i]
            while run is not None:
                if run.queue and run.queue[0].is_cancelled:
                    self._end_cancelled(run)
                if not run.is_done:
                    break
                run = self._table.release(run)
                self._runs[i] = run
                if run is not None:
                    self._on_slot_given(run)

    def _end_cancelled(self, run: Run[SequenceRequest]) -> None:
        self._table.end(run)
        error = SequenceCancelledError(model=self._policy.model, correlation_id=run.correlation_id)
        self._on_dequeue(len(run.queue))
        while run.queue:
            fail(run.queue.popleft(), error)

    def _form(self, last_slot: int) -> list[_Row]:
        """Rows for slots 0..``last_slot``: each slot's next request, or a filler."""
        specs = self._policy.states
        takes_requests = self._engine.takes_requests
        rows: list[_Row] = []
        example: SequenceRequest | None = None
        shapes: dict[str, tuple[int, ...]] | None = None
        check_shapes = not takes_requests and self._policy.max_batch_size > 0
        for run in self._runs[: last_slot + 1]:
            request = run.queue[0] if run is not None and run.queue else None
            if request is None or run is None:
                rows.append(_Row(None, None, None))
                continue
            if check_shapes:
                row_shapes = _shapes(request, run, specs)
                if shapes is None:
                    shapes = row_shapes
                elif row_shapes != shapes:
                    rows.append(_Row(None, None, None))
                    continue
            run.queue.popleft()
            run.is_running = True
            example = example or request
            inputs = dict(request.inputs)
            if specs:
                inputs.update(current_state(request, run, specs))
            context = request.model_context() if takes_requests else _NO_CONTEXT
            rows.append(_Row(request, run, BatchRow(inputs, context)))
        if example is None:
            raise RuntimeError("a direct batch was formed without a request")
        self._on_dequeue(sum(1 for row in rows if row.request is not None))
        filler = filler_inputs(example.inputs)
        filler.update(initial_inputs(specs))
        context = _NO_CONTEXT
        if takes_requests:
            context = RequestContext(requested_outputs=example.model_context().requested_outputs)
        filler_row = BatchRow(filler, context)
        for row in rows:
            if row.batch_row is None:
                row.batch_row = filler_row
        # The control tensors of the whole batch at once, one row per slot.
        controls = self._controls.for_rows([_control_row(row.request) for row in rows])
        for row in rows:
            assert row.batch_row is not None
            row.batch_row.controls = controls
        return rows

    async def _execute(self, rows: list[_Row]) -> None:
        real = [row for row in rows if row.request is not None]
        self.executing += len(real)
        error: ZeroserveError
        try:
            exec_start = self._clock()
            started = self._clock()
            outcomes = await self._engine.run([row.batch_row for row in rows if row.batch_row])
            compute_ns = self._clock() - started
            exec_end = self._clock()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                _fail_rows(real, ServerStoppingError())
                raise
            # The engine's own await was cancelled (an executor shut down under it).
            error = InternalError("the engine cancelled the execution")
        except ZeroserveError as exc:
            error = exc
        else:
            self._finish(rows, outcomes, compute_ns, started, exec_start, exec_end)
            return
        finally:
            self.executing -= len(real)
            for row in real:
                if row.run is not None:
                    row.run.is_running = False
            self._wake.set()
            self._on_executed()
        _fail_rows(real, error)

    def _finish(
        self,
        rows: list[_Row],
        outcomes: list[RequestOutcome],
        compute_ns: int,
        started: int,
        exec_start: int,
        exec_end: int,
    ) -> None:
        specs = self._policy.states
        for row, outcome in zip(rows, outcomes, strict=True):
            request, run = row.request, row.run
            if request is None or run is None:
                continue
            if isinstance(outcome, ZeroserveError):
                fail(request, outcome)
                continue
            if specs:
                state_of(run, specs).update(outcome)
            result = BatchedResult(
                outcome,
                started - request.enqueue_ns,
                compute_ns,
                len(rows),
                started,
                exec_start,
                exec_end,
            )
            resolve(request, result)
        if self._on_execution is not None:
            try:
                self._on_execution(len(rows), compute_ns)
            except Exception:
                logger.exception("on_execution callback failed")


def _control_row(request: SequenceRequest | None) -> Row:
    return None if request is None else (request.flags, request.correlation_id)


@dataclass(slots=True)
class _Row:
    """One row of a batch being formed: a slot's request and its run, or a filler (both
    None); ``batch_row`` is what the engine gets."""

    request: SequenceRequest | None
    run: Run[SequenceRequest] | None
    batch_row: BatchRow | None


def _fail_rows(rows: list[_Row], error: BaseException) -> None:
    for row in rows:
        if row.request is not None:
            fail(row.request, error)


def _shapes(
    request: SequenceRequest, run: Run[SequenceRequest], specs: tuple[StateSpec, ...]
) -> dict[str, tuple[int, ...]]:
    """The non-batch shapes a row brings to a merged batch (its state's included)."""
    shapes = {name: array.shape[1:] for name, array in request.inputs.items()}
    if specs:
        # A request with START runs on the initial state, whatever the run holds now.
        states = (
            initial_inputs(specs)
            if run.state is None or request.flags & START
            else run.state.values
        )
        shapes.update({name: array.shape[1:] for name, array in states.items()})
    return shapes
