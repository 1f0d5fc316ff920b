"""The oldest strategy: one lane's candidate sequences fed to a dynamic batcher (Triton's
``OldestSequenceBatch``).

Each sequence in a slot sends its next request to the lane's :class:`Batcher` as soon as
its previous one has finished, so a batch holds at most one request of each sequence and
forms under the dynamic batcher's rules (the strategy's preferred sizes and
``max_queue_delay_microseconds``) from the sequences that have one ready, oldest first. When
a sequence is done its slot goes to the oldest backlogged one. A sequence whose next request
was cancelled ends, its queued requests failing (Triton's rule).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import numpy as np

from data_plane.batcher import Batcher
from data_plane.errors import InternalError, ServerStoppingError, ZeroserveError
from data_plane.sequence.controls import ControlTensors
from data_plane.sequence.errors import SequenceCancelledError
from data_plane.sequence.policy import SequencePolicy
from data_plane.sequence.queued import SequenceRequest, fail, model_inputs, resolve, state_of
from data_plane.sequence.table import Run, SequenceTable

logger = logging.getLogger(__name__)


class OldestLane:
    """One lane of an oldest-strategy batcher: its slots and its dynamic batcher.

    Parameters:
        index: the lane's number (its slots' ``Slot.lane``).
        policy: the model's sequence policy.
        table: the batcher's sequence table (shared by its lanes).
        batcher: the lane's dynamic batcher (one instance), started and closed here.
        controls: builds the control tensors.
        takes_requests: the engine takes separate requests (they need their context).
        on_slot_given: called with a backlogged run this lane gave a slot.
        on_dequeue: called with the number of requests that left the queues.
        on_executed: called after each execution has ended.
    """

    def __init__(
        self,
        index: int,
        policy: SequencePolicy,
        table: SequenceTable[SequenceRequest],
        batcher: Batcher,
        controls: ControlTensors,
        *,
        takes_requests: bool,
        on_slot_given: Callable[[Run[SequenceRequest]], None],
        on_dequeue: Callable[[int], None],
        on_executed: Callable[[], None],
    ) -> None:
        self.index = index
        self._policy = policy
        self._table = table
        self._batcher = batcher
        self._controls = controls
        self._takes_requests = takes_requests
        self._on_slot_given = on_slot_given
        self._on_dequeue = on_dequeue
        self._on_executed = on_executed
        self._runs: dict[int, Run[SequenceRequest]] = {}
        self._steps: set[asyncio.Task[None]] = set()
        self.executing = 0
        self._stopped = False

    async def start(self) -> None:
        await self._batcher.start()

    def assign(self, run: Run[SequenceRequest]) -> None:
        """``run`` was given one of this lane's slots: send its first request."""
        slot = run.slot
        if slot is None or slot.lane != self.index:
            raise ValueError("the run holds no slot of this lane")
        self._runs[slot.index] = run
        self._advance(run)

    def kick(self, run: Run[SequenceRequest]) -> None:
        """``run`` has a new request, or may be done."""
        self._advance(run)

    @property
    def is_idle(self) -> bool:
        return not self.executing and not any(run.queue for run in self._runs.values())

    async def stop(self, *, timeout_s: float) -> None:
        """Close the dynamic batcher (its requests drain for ``timeout_s``, then fail) and
        wait for the lane's steps."""
        await self._batcher.close(timeout_s=timeout_s)
        self._stopped = True
        for step in list(self._steps):
            step.cancel()
        if self._steps:
            await asyncio.wait(self._steps, timeout=timeout_s)

    def fail_queued(self, error: BaseException) -> None:
        """Fail every request still in this lane's slots."""
        for run in self._runs.values():
            self._on_dequeue(len(run.queue))
            while run.queue:
                fail(run.queue.popleft(), error)

    def _advance(self, run: Run[SequenceRequest] | None) -> None:
        """Send ``run``'s next request if none of it is executing; hand its slot on when
        it is done (and send the next run's first request)."""
        while run is not None and not run.is_running and not self._stopped:
            if run.queue and run.queue[0].is_cancelled:
                self._end_cancelled(run)
            if run.queue:
                self._send(run, run.queue.popleft())
                return
            if not run.is_done or run.slot is None:
                return
            slot = run.slot
            del self._runs[slot.index]
            run = self._table.release(run)
            if run is not None:
                self._runs[slot.index] = run
                self._on_slot_given(run)

    def _end_cancelled(self, run: Run[SequenceRequest]) -> None:
        self._table.end(run)
        error = SequenceCancelledError(model=self._policy.model, correlation_id=run.correlation_id)
        self._on_dequeue(len(run.queue))
        while run.queue:
            fail(run.queue.popleft(), error)

    def _send(self, run: Run[SequenceRequest], request: SequenceRequest) -> None:
        self._on_dequeue(1)
        run.is_running = True
        self.executing += 1
        inputs = model_inputs(request, run, self._controls, self._policy.states)
        step = asyncio.create_task(
            self._step(run, request, inputs), name=f"sequence-oldest-{self.index}"
        )
        self._steps.add(step)
        step.add_done_callback(self._steps.discard)

    async def _step(
        self, run: Run[SequenceRequest], request: SequenceRequest, inputs: dict[str, np.ndarray]
    ) -> None:
        try:
            result = await self._batcher.submit(
                inputs,
                request_id=request.request_id,
                context=request.model_context() if self._takes_requests else None,
            )
        except asyncio.CancelledError:
            fail(request, ServerStoppingError())
            raise
        except ZeroserveError as exc:
            fail(request, exc)
        except Exception as exc:
            logger.exception("sequence request failed in the dynamic batcher")
            fail(request, InternalError(str(exc) or type(exc).__name__))
        else:
            if self._policy.states:
                state_of(run, self._policy.states).update(result.outputs)
            resolve(request, result)
        finally:
            self.executing -= 1
            run.is_running = False
            self._advance(run)
            self._on_executed()
