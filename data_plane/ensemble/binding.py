"""Checking an ensemble against its composing models once they are loaded, as Triton does
before it serves one: batch sizes, every mapping naming a real input or output, every
required input fed, and each ensemble tensor of one datatype and one shape wherever it
is written or read. Texts are Triton's (``ValidateEnsembleConfig``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from data_plane.ensemble.step import BoundStep
from data_plane.protocol import RequestedOutput
from foundation.ensemble_config import EnsembleStep, steps_of
from foundation.proto.model_config_pb2 import DataType, ModelConfig

ConfigLookup = Callable[[str, int | None], ModelConfig]
"""The config of a composing model's version (``None``: its latest serving one)."""


class EnsembleBindingError(ValueError):
    """An ensemble that does not fit its composing models; the message is Triton's."""


@dataclass(frozen=True, slots=True)
class _TensorUse:
    """One place an ensemble tensor is written or read: by which model, of which type and
    shape (``full_dims`` with the batch dimension when that model batches)."""

    model: str
    datatype: int
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]

    @classmethod
    def of(cls, model: str, max_batch_size: int, datatype: int, dims: Sequence[int]) -> _TensorUse:
        dims = tuple(dims)
        return cls(model, datatype, dims, ((-1,) if max_batch_size > 0 else ()) + dims)


def bind_steps(config: ModelConfig, composing: ConfigLookup) -> list[BoundStep]:
    """``config``'s steps checked against the composing models ``composing`` gives,
    ready to run. Raises EnsembleBindingError with Triton's text."""
    name = config.name
    tensors: dict[str, _TensorUse] = {}
    # The ensemble's own tensors as its steps see them: reshaped, where the config says.
    for given in config.input:
        dims = given.reshape.shape if given.HasField("reshape") else given.dims
        tensors[given.name] = _TensorUse.of(name, config.max_batch_size, given.data_type, dims)
    for answered in config.output:
        dims = answered.reshape.shape if answered.HasField("reshape") else answered.dims
        tensors[answered.name] = _TensorUse.of(
            name, config.max_batch_size, answered.data_type, dims
        )
    bound = []
    for step in steps_of(config):
        model_config = composing(step.model, step.version)
        limit = model_config.max_batch_size
        if limit != 0 and limit < config.max_batch_size:
            raise EnsembleBindingError(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                f"contains model {step.model} which only allows maximum batch size to be {limit}"
            )
        _bind_inputs(name, step, model_config, tensors)
        _bind_outputs(name, step, model_config, tensors)
        bound.append(
            BoundStep(
                index=step.index,
                model=step.model,
                version=step.version,
                inputs=step.inputs,
                outputs=step.outputs,
                requested=tuple(RequestedOutput(output) for output, _ in step.outputs),
                is_decoupled=model_config.model_transaction_policy.decoupled,
            )
        )
    return bound


def is_decoupled(config: ModelConfig, steps: Sequence[BoundStep]) -> bool:
    """Whether the ensemble ``config`` (its data flow checked, its ``steps`` bound) is
    decoupled, as Triton decides: when any step is. Each tensor descends from the last
    decoupled step before it (or from none); a step's inputs, and the ensemble's outputs,
    must all descend from the same one, since each response of a decoupled step is a
    separate run of what follows it. Raises EnsembleBindingError with Triton's text."""
    name = config.name
    outputs = {tensor.name for tensor in config.output}
    origin: dict[str, int] = {tensor.name: 0 for tensor in config.input}
    """Ensemble tensor -> the decoupled step it descends from (0: none; else its rank)."""
    decoupled_count = 0
    pending = list(steps)
    while pending:
        runnable = [s for s in pending if all(t in origin for _, t in s.inputs)]
        if not runnable:
            return decoupled_count > 0  # unreachable steps: refused by the flow checks
        for step in runnable:
            pending.remove(step)
            sources = {origin[tensor] for _, tensor in step.inputs}
            if len(sources) > 1:
                # Triton names the model that declared the tensor first: the ensemble
                # for its own outputs.
                owner = name if any(t in outputs for _, t in step.outputs) else step.model
                raise EnsembleBindingError(_mixed_origins(name, owner))
            label = min(sources, default=0)
            if step.is_decoupled:
                decoupled_count += 1
                label = decoupled_count
            for _, tensor in step.outputs:
                origin[tensor] = label
    if len({origin.get(tensor, 0) for tensor in outputs}) > 1:
        raise EnsembleBindingError(_mixed_origins(name, name))
    return decoupled_count > 0


def _mixed_origins(ensemble: str, model: str) -> str:
    return (
        f"in ensemble {ensemble}, step of model '{model}' receives inputs originated from "
        "different decoupled models"
    )


def _bind_inputs(
    ensemble: str, step: EnsembleStep, config: ModelConfig, tensors: dict[str, _TensorUse]
) -> None:
    names = {spec.name for spec in config.input}
    for model_input, tensor in step.inputs:
        if model_input not in names:
            raise EnsembleBindingError(
                f"in ensemble {ensemble}, ensemble tensor {tensor} is mapping to non-existing "
                f"input {model_input} in model {step.model}"
            )
    mapped = dict(step.inputs)
    for spec in config.input:
        source = mapped.get(spec.name)
        if source is None:
            if spec.optional:
                continue
            raise EnsembleBindingError(
                f"in ensemble {ensemble}, input {spec.name} in model {step.model} is not "
                "mapped to any ensemble tensors"
            )
        use = _TensorUse.of(step.model, config.max_batch_size, spec.data_type, spec.dims)
        _agree(ensemble, source, tensors, use)


def _bind_outputs(
    ensemble: str, step: EnsembleStep, config: ModelConfig, tensors: dict[str, _TensorUse]
) -> None:
    specs = {spec.name: spec for spec in config.output}
    for model_output, tensor in step.outputs:
        if model_output not in specs:
            raise EnsembleBindingError(
                f"in ensemble {ensemble}, ensemble tensor {tensor} is mapped from "
                f"non-existing output {model_output} in model {step.model}"
            )
    for model_output, tensor in step.outputs:
        spec = specs[model_output]
        use = _TensorUse.of(step.model, config.max_batch_size, spec.data_type, spec.dims)
        _agree(ensemble, tensor, tensors, use)


def _agree(ensemble: str, tensor: str, tensors: dict[str, _TensorUse], use: _TensorUse) -> None:
    """Record ``use`` of ``tensor``, or check it against the first one recorded: the same
    datatype, and shapes equal where neither is variable (with or without the batch
    dimension, so that a batching and a non-batching model may share a tensor)."""
    known = tensors.get(tensor)
    if known is None:
        tensors[tensor] = use
        return
    prefix = f"in ensemble {ensemble}, ensemble tensor {tensor}: "
    if known.datatype != use.datatype:
        raise EnsembleBindingError(
            f"{prefix}inconsistent data type: {DataType.Name(known.datatype)} is inferred from "
            f"model {known.model} while {DataType.Name(use.datatype)} is inferred from model "
            f"{use.model}"
        )
    if not _same_dims(known.dims, use.dims) and not _same_dims(known.full_dims, use.full_dims):
        raise EnsembleBindingError(
            f"{prefix}inconsistent shape: {_dims_text(known.full_dims)} is inferred from model "
            f"{known.model} while {_dims_text(use.full_dims)} is inferred from model {use.model}"
        )


def _same_dims(left: tuple[int, ...], right: tuple[int, ...]) -> bool:
    return len(left) == len(right) and all(
        a == b or a == -1 or b == -1 for a, b in zip(left, right, strict=True)
    )


def _dims_text(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"
