"""A request waiting in its sequence, and what both strategies do to it: turn it into the
model's inputs (control tensors, state), and answer it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from data_plane.batcher import BatchedResult
from data_plane.sequence.controls import ControlTensors
from data_plane.sequence.state import SequenceState, StateSpec
from data_plane.sequence.table import START, CorrelationId, Run
from runtimes.model_request import RequestContext

_NO_CONTEXT = RequestContext()


class SequenceRequest:
    """One request from submit until it is answered."""

    __slots__ = (
        "context",
        "correlation_id",
        "enqueue_ns",
        "flags",
        "future",
        "inputs",
        "request_id",
    )

    def __init__(
        self,
        inputs: Mapping[str, np.ndarray],
        correlation_id: CorrelationId,
        flags: int,
        future: asyncio.Future[BatchedResult],
        enqueue_ns: int,
        request_id: str | None,
        context: RequestContext | None,
    ) -> None:
        self.inputs = inputs
        self.correlation_id = correlation_id
        self.flags = flags
        self.future = future
        self.enqueue_ns = enqueue_ns
        self.request_id = request_id
        self.context = context

    @property
    def is_cancelled(self) -> bool:
        """Its caller went away (or it was already answered) before it ran."""
        return self.future.done()

    def model_context(self) -> RequestContext:
        """What a model taking separate requests learns of it."""
        return replace(
            self.context or _NO_CONTEXT,
            correlation_id=self.correlation_id,
            flags=self.flags,
            is_cancelled=self.future.done,
        )


def resolve(request: SequenceRequest, result: BatchedResult) -> None:
    if not request.future.done():
        request.future.set_result(result)


def fail(request: SequenceRequest, error: BaseException) -> None:
    if not request.future.done():
        request.future.set_exception(error)


def state_of(run: Run[SequenceRequest], specs: tuple[StateSpec, ...]) -> SequenceState:
    """The run's implicit state, made on first use."""
    if run.state is None:
        run.state = SequenceState(specs)
    return run.state


def current_state(
    request: SequenceRequest, run: Run[SequenceRequest], specs: tuple[StateSpec, ...]
) -> dict[str, np.ndarray]:
    """The sequence's state inputs for ``request`` (reset first when it has START)."""
    state = state_of(run, specs)
    if request.flags & START:
        state.reset()
    return state.values


def model_inputs(
    request: SequenceRequest,
    run: Run[SequenceRequest],
    controls: ControlTensors,
    specs: tuple[StateSpec, ...],
) -> dict[str, np.ndarray]:
    """The request's inputs as the model takes them: the client's, the control tensors for
    its flags, and the sequence's state (reset first when the request has START)."""
    inputs = dict(request.inputs)
    inputs.update(controls.for_request(request.flags, request.correlation_id))
    if specs:
        inputs.update(current_state(request, run, specs))
    return inputs
