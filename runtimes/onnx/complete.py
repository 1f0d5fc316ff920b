"""Triton-style auto-complete of a model configuration from the ONNX graph.

Adds the model's inputs and outputs the config does not list (and fills the datatype or
dims of listed ones that lack them). When ``max_batch_size`` is 0, every input and output
has a dynamic first dimension and the listed dims do not spell out the full rank, sets
``max_batch_size`` to :data:`DEFAULT_MAX_BATCH_SIZE`, adds ``dynamic_batching {}`` when no
scheduler is set, and leaves dim 0 out of the dims. Reads only the graph's inputs, outputs
and initializer names (:mod:`runtimes.onnx.wire`): the weights, inside the file or not, are
skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeAlias, cast

import onnx
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from foundation import datatypes
from foundation.proto import model_config_pb2 as mc
from foundation.sequence_config import sequence_tensor_names
from runtimes.errors import ModelLoadError
from runtimes.onnx.dtypes import ONNX_ELEM_TYPES
from runtimes.onnx.wire import read_graph_interface

DEFAULT_MAX_BATCH_SIZE: Final = 4
"""What auto-complete sets ``max_batch_size`` to (Triton's ``default-max-batch-size``)."""

_TensorEntries: TypeAlias = (
    RepeatedCompositeFieldContainer[mc.ModelInput] | RepeatedCompositeFieldContainer[mc.ModelOutput]
)


def complete_from_graph(path: Path, config: mc.ModelConfig, *, model: str, backend: str) -> None:
    """Auto-complete ``config`` from the ONNX file at ``path``, which exists.

    Sets ``backend`` when the config names neither a backend nor a platform. Raises
    :class:`ModelLoadError` for ``model`` when the file cannot be read as ONNX or the graph
    has tensors the server cannot serve.
    """
    try:
        graph_inputs, graph_outputs, initializers = read_graph_interface(path)
    except Exception as exc:
        raise ModelLoadError(model=model, reason=f"cannot read {path.name} as ONNX: {exc}") from exc
    try:
        # Before IR version 4 every initializer was also listed as a graph input; those
        # are weights, not request tensors.
        inputs = [_describe(v) for v in graph_inputs if v.name not in initializers]
        outputs = [_describe(v) for v in graph_outputs]
    except ValueError as exc:
        raise ModelLoadError(model=model, reason=str(exc)) from exc
    _complete(config, inputs, outputs, backend)


@dataclass(frozen=True)
class _GraphTensor:
    """A graph input or output as auto-complete sees it."""

    name: str
    datatype: str
    shape: tuple[int, ...] | None
    """Dimensions with -1 for symbolic or unknown ones; None when the rank is unknown."""


def _describe(value: onnx.ValueInfoProto) -> _GraphTensor:
    if value.type.WhichOneof("value") != "tensor_type":
        raise ValueError(f"model tensor {value.name!r} is not a tensor; only tensors are served")
    tensor_type = value.type.tensor_type
    datatype = ONNX_ELEM_TYPES.get(tensor_type.elem_type)
    if datatype is None:
        elem = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
        raise ValueError(f"model tensor {value.name!r} has unsupported element type {elem}")
    shape: tuple[int, ...] | None = None
    if tensor_type.HasField("shape"):
        shape = tuple(
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1
            for d in tensor_type.shape.dim
        )
    return _GraphTensor(value.name, datatype, shape)


def _complete(
    config: mc.ModelConfig,
    inputs: Sequence[_GraphTensor],
    outputs: Sequence[_GraphTensor],
    backend: str,
) -> None:
    if config.max_batch_size == 0 and _can_batch(config, inputs, outputs):
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        if config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
    is_batched = config.max_batch_size > 0
    # The sequence batcher's control and state tensors are not request tensors: Triton's
    # ONNX backend completes only configs listing no inputs, so users list theirs.
    fed, kept = sequence_tensor_names(config)
    for tensor in inputs:
        if tensor.name not in fed:
            _complete_tensor(config.input, tensor, is_batched)
    for tensor in outputs:
        if tensor.name not in kept:
            _complete_tensor(config.output, tensor, is_batched)
    if not config.backend and not config.platform:
        config.backend = backend


def _can_batch(
    config: mc.ModelConfig, inputs: Sequence[_GraphTensor], outputs: Sequence[_GraphTensor]
) -> bool:
    graph = [*inputs, *outputs]
    if not graph or any(not t.shape or t.shape[0] != -1 for t in graph):
        return False
    shapes = {t.name: t.shape for t in graph}
    # Listed dims of the model's full rank mean the user counts dim 0 as data, not batch.
    listed = [(e.name, len(e.dims)) for e in config.input]
    listed += [(e.name, len(e.dims)) for e in config.output]
    return not any(rank and rank == len(shapes.get(name) or ()) for name, rank in listed)


def _complete_tensor(entries: _TensorEntries, tensor: _GraphTensor, is_batched: bool) -> None:
    if tensor.shape is None:
        dims: list[int] = [-1]
    else:
        dims = list(tensor.shape[1:] if is_batched else tensor.shape)
    entry = next((e for e in entries if e.name == tensor.name), None)
    if entry is None:
        entry = entries.add()
        entry.name = tensor.name
    if entry.data_type == mc.TYPE_INVALID:
        entry.data_type = cast(mc.DataType, datatypes.config_from_protocol(tensor.datatype))
    if not entry.dims:
        entry.dims.extend(dims)
