"""An ensemble's step bound to its composing model, and how the ensemble reports a
step's error: what the scheduler and the streaming run share."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from data_plane.errors import ZeroserveError
from data_plane.model_version import LoadedVersion
from data_plane.protocol import InferInput, InferRequest, RequestedOutput

ErrorT = TypeVar("ErrorT", bound=ZeroserveError)


class ModelLookup(Protocol):
    """The serving version of a composing model (``None``: the latest), or the
    repository's error for it."""

    def __call__(self, name: str, version: int | None = None, /) -> LoadedVersion: ...


@dataclass(frozen=True, slots=True)
class BoundStep:
    """A step checked against its composing model, ready to run."""

    index: int
    model: str
    version: int | None
    """None: the composing model's latest serving version, looked up per request."""
    inputs: tuple[tuple[str, str], ...]
    """``(model input, ensemble tensor)``."""
    outputs: tuple[tuple[str, str], ...]
    """``(model output, ensemble tensor)``."""
    requested: tuple[RequestedOutput, ...]
    """The model outputs the step asks for: those the ensemble maps."""
    is_decoupled: bool = False
    """The composing model is decoupled: any number of responses, each run on by the
    steps that follow."""


def in_ensemble(name: str, error: ErrorT) -> ErrorT:
    """``error`` as the ensemble ``name`` reports it: Triton's prefix on the message, the
    same class and fields (so the same status on every transport)."""
    kind = type(error)
    wrapped = kind.__new__(kind)
    wrapped.__dict__.update(error.__dict__)
    wrapped.message = f"in ensemble '{name}', {error.message}"
    wrapped.args = (wrapped.message,)
    return wrapped


def step_request(
    step: BoundStep, inputs: Iterable[tuple[str, str, np.ndarray]], request: InferRequest
) -> InferRequest:
    """The request ``step`` sends its model for the ensemble's ``request``: ``inputs``
    as ``(model input, datatype, array)``, the arrays as they are. The ensemble request's
    id, parameters, priority and timeout go to every step, as Triton passes them."""
    return InferRequest(
        id=request.id,
        inputs=[InferInput(name, datatype, array.shape, array) for name, datatype, array in inputs],
        outputs=list(step.requested),
        parameters=request.parameters,
        binary_data_output=False,
        priority=request.priority,
        timeout_us=request.timeout_us,
    )
