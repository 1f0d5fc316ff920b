"""Requests one by one, for engines whose contract is a list of requests rather than one
merged batch (Triton's Python backend: ``execute(requests)``, one response each).

The batcher forms batches as it always does; for a runtime that offers
:class:`RequestExecutor` (through its capabilities) it hands over the batch's requests
as they came, each with its own tensors and :class:`RequestContext`, instead of
concatenating their rows, and takes back one outcome per request, so that an error in
one fails only that request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One request of a batch: its own tensors (its rows only) and its context."""

    inputs: Mapping[str, np.ndarray]
    context: RequestContext


RequestOutcome = dict[str, np.ndarray] | ZeroserveError
"""A request's outputs, or the error that fails it alone."""


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
