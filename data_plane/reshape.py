"""Triton's ``reshape``: tensors whose shape inside the model differs from the one clients
see (``dims``).

An input with a ``reshape`` is checked against its ``dims`` (by the request decoder, as any
input) and reaches the engine as ``reshape.shape``; an output with one leaves the engine as
``reshape.shape`` and reaches the client as its ``dims``. A batching model keeps its batch
dimension in front. Variable-size dimensions take their sizes in order: the k-th -1 of the
target shape is the size of the k-th -1 of the source, which the configuration check
(:func:`foundation.model_config.normalize`) makes hold the same runs of elements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from data_plane.errors import InternalError
from foundation.proto.model_config_pb2 import ModelConfig


@dataclass(frozen=True, slots=True)
class ReshapeRule:
    """One tensor's reshape: from the shape it arrives in to the shape it leaves in (batch
    dimension excluded)."""

    source: tuple[int, ...]
    target: tuple[int, ...]


class TensorReshape:
    """The reshapes of one model version, applied to whole batches or single requests.

    Reshaping a contiguous array is a view: nothing is copied.
    """

    __slots__ = ("_inputs", "_is_batched", "_model", "_outputs")

    def __init__(
        self,
        model: str,
        *,
        inputs: Mapping[str, ReshapeRule],
        outputs: Mapping[str, ReshapeRule],
        is_batched: bool,
    ) -> None:
        self._model = model
        self._inputs = dict(inputs)
        self._outputs = dict(outputs)
        self._is_batched = is_batched

    @classmethod
    def from_config(cls, config: ModelConfig) -> TensorReshape | None:
        """The reshapes a normalized config asks for; None when it asks for none."""
        inputs = {
            t.name: ReshapeRule(tuple(t.dims), tuple(t.reshape.shape))
            for t in config.input
            if t.HasField("reshape")
        }
        outputs = {
            t.name: ReshapeRule(tuple(t.reshape.shape), tuple(t.dims))
            for t in config.output
            if t.HasField("reshape")
        }
        if not inputs and not outputs:
            return None
        return cls(
            config.name, inputs=inputs, outputs=outputs, is_batched=config.max_batch_size > 0
        )

    def to_model(self, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Inputs as the engine takes them; the request decoder has checked them against
        their ``dims``."""
        reshaped = dict(tensors)
        for name, rule in self._inputs.items():
            array = tensors.get(name)
            if array is not None:
                reshaped[name] = self._apply(array, rule, "input", name)
        return reshaped

    def from_model(self, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs as clients see them. An output the engine made in a shape its reshape
        does not describe is the engine's fault: InternalError."""
        reshaped = dict(tensors)
        for name, rule in self._outputs.items():
            array = tensors.get(name)
            if array is not None:
                reshaped[name] = self._apply(array, rule, "output", name)
        return reshaped

    def _apply(self, array: np.ndarray, rule: ReshapeRule, kind: str, name: str) -> np.ndarray:
        lead = array.shape[:1] if self._is_batched else ()
        shape = array.shape[len(lead) :]
        target = _target_shape(shape, rule)
        if target is None:
            raise InternalError(
                f"model '{self._model}' {kind} '{name}' has shape {list(array.shape)}, which "
                f"its reshape from {list(rule.source)} to {list(rule.target)} does not fit"
            )
        return array.reshape(lead + target)


def _target_shape(shape: Sequence[int], rule: ReshapeRule) -> tuple[int, ...] | None:
    """``shape`` (matching ``rule.source``) as ``rule.target``, its variable sizes carried
    over in order; None when ``shape`` does not match the source."""
    if len(shape) != len(rule.source):
        return None
    variable = []
    for size, dim in zip(shape, rule.source, strict=True):
        if dim == -1:
            variable.append(size)
        elif size != dim:
            return None
    sizes = iter(variable)
    target = tuple(next(sizes, 1) if dim == -1 else dim for dim in rule.target)
    if int(np.prod(target, dtype=np.int64)) != int(np.prod(shape, dtype=np.int64)):
        return None
    return target
