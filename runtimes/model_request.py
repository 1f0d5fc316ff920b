"""Requests one by one, for engines whose contract is a list of requests rather than one
merged batch (Triton's Python backend: ``execute(requests)``, one response each).

The batcher forms batches as it always does; for a runtime that offers
:class:`RequestExecutor` (through its capabilities) it hands over the batch's requests
as they came, each with its own tensors and :class:`RequestContext`, instead of
concatenating their rows, and takes back one outcome per request, so that an error in
one fails only that request.

A decoupled model answers a request with any number of responses, sent while or after
its execution runs: the request's context carries a :class:`ResponseSink` that takes
them one by one, the last one final. A model may also call other models of the server
(Triton's BLS) through a :class:`ModelCaller` the server gives the runtime.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from foundation.errors import ZeroserveError


def _never() -> bool:
    return False


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a request carries besides its tensors."""

    request_id: str = ""
    """The client's id ("" when it gave none)."""
    correlation_id: int | str = 0
    """The request's ``sequence_id`` parameter (0 when absent)."""
    parameters: Mapping[str, bool | int | float | str] = field(default_factory=dict)
    """The client's parameters, in its order, without those Triton reserves."""
    requested_outputs: Sequence[str] = ()
    """The outputs asked for, in order; every configured output when the client named none."""
    flags: int = 0
    """Triton's request flags (sequence start and end)."""
    is_cancelled: Callable[[], bool] = _never
    """Whether the client has gone away (cheap; asked from the event loop)."""
    responses: ResponseSink | None = None
    """Where a decoupled model's responses go; None for a model that answers once (its
    outcome is the answer)."""


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One request of a batch: its own tensors (its rows only) and its context."""

    inputs: Mapping[str, np.ndarray]
    context: RequestContext


RequestOutcome = dict[str, np.ndarray] | ZeroserveError
"""A request's outputs, or the error that fails it alone. A request with a response sink
gets an empty dict when its execution ended well: its answers went to the sink."""


@dataclass(frozen=True, slots=True)
class StreamedResponse:
    """One response of a decoupled model (or of a model called through BLS)."""

    outputs: Mapping[str, np.ndarray]
    """The outputs it carries (none for a bare final flag or an error)."""
    error: ZeroserveError | None = None
    """The error it carries instead of outputs."""
    is_final: bool = False
    """No response follows for this request."""


class ResponseSink(Protocol):
    """Takes a request's responses in order, from the event loop."""

    def __call__(self, response: StreamedResponse, taken: Callable[[], None]) -> None:
        """Take ``response``; call ``taken()`` (now or later, once) when there is room for
        the next, so that a model sending faster than its client reads waits."""
        ...


@dataclass(frozen=True, slots=True)
class ModelCall:
    """A request a model makes to another model of the server (Triton's BLS)."""

    model: str
    inputs: Mapping[str, np.ndarray]
    requested_outputs: Sequence[str] = ()
    """The outputs asked for; every output of the model when empty."""
    version: int = -1
    """-1: the version the server would choose for a client."""
    request_id: str = ""
    correlation_id: int | str = 0
    flags: int = 0
    timeout_us: int = 0
    parameters: Mapping[str, bool | int | str] = field(default_factory=dict)
    is_decoupled: bool = False
    """The caller takes any number of responses (``exec(decoupled=True)``)."""


class ModelCaller(Protocol):
    """Runs a model's calls to other models, as a client request would run."""

    def call(self, call: ModelCall) -> AsyncGenerator[StreamedResponse, None]:
        """The responses to ``call``, the last one final. Every failure (an unknown model,
        bad inputs, the model's own error) comes as a final response carrying the error,
        in Triton's words; closing the iterator early cancels the call."""
        ...


class RequestExecutor(Protocol):
    """Runs a batch as its separate requests."""

    async def execute_requests(self, requests: Sequence[ModelRequest]) -> list[RequestOutcome]:
        """One execution of ``requests``: one outcome per request, in order. Raises (a
        ZeroserveError with the client's text) when the whole execution failed. Called
        by at most the instance count at once, as ``ModelRuntime.infer`` is."""
        ...


class FailureReporter(Protocol):
    """An engine that can fail for good on its own (its process crashed) while the server
    stays healthy: the version should stop serving, and may be loaded again."""

    def on_failure(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` once, from the event loop, when the engine fails."""
        ...
