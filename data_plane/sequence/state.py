"""Implicit state: the tensors a sequence model carries from one request of a sequence to
the next, kept by the batcher (``sequence_batching { state [...] }``).

Each state has an input the batcher feeds (``input_name``) and an output it reads back
(``output_name``). A sequence's state starts from the state's ``initial_state`` (zeros,
or the bytes of a file in the model's ``initial_state`` folder; zeros when none is given,
where Triton leaves the memory unset) and is set back to it by every request with the START
flag; after each execution the row of the output becomes the next input. A model that does
not produce the output leaves the state as it was, as in Triton (whose Python backend never
updates state). The filler rows of a direct batch get the initial state.

:func:`read_states` makes Triton's load-time checks, with its texts (``Invalid argument:``
reasons of ``SequenceBatchScheduler::GenerateInitialStateData``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np

from data_plane.errors import ModelLoadError
from foundation.datatypes import NUMPY_DTYPES, protocol_from_config
from foundation.proto.model_config_pb2 import ModelConfig, ModelSequenceBatching as Batching
from foundation.sequence_config import unique_states

INITIAL_STATE_FOLDER = "initial_state"
"""Where ``initial_state { data_file }`` files live, in the model's folder (Triton's)."""


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One implicit state and its initial value (one row)."""

    input_name: str
    output_name: str
    datatype: str
    initial: np.ndarray
    """Shape ``[1, *dims]`` for a batching model, ``dims`` otherwise (-1 dims as 1)."""


class SequenceState:
    """One sequence's state tensors, by input name."""

    __slots__ = ("_specs", "values")

    def __init__(self, specs: tuple[StateSpec, ...]) -> None:
        self._specs = specs
        self.values: dict[str, np.ndarray] = {s.input_name: s.initial for s in specs}

    def reset(self) -> None:
        """Back to the initial state (a request with START)."""
        for spec in self._specs:
            self.values[spec.input_name] = spec.initial

    def update(self, outputs: Mapping[str, np.ndarray]) -> None:
        """Take the state outputs the model produced for this sequence's row."""
        for spec in self._specs:
            produced = outputs.get(spec.output_name)
            if produced is not None:
                # A copy: the row is a view into the whole batch's output.
                self.values[spec.input_name] = np.array(produced, copy=True)


def initial_inputs(specs: tuple[StateSpec, ...]) -> dict[str, np.ndarray]:
    """The state inputs of a row with no sequence (a direct batch's filler)."""
    return {s.input_name: s.initial for s in specs}


def read_states(config: ModelConfig, model_dir: Path) -> tuple[StateSpec, ...]:
    """The states of a normalized sequence config with their initial values (reads
    ``initial_state`` files: blocking). Raises ModelLoadError with Triton's reason."""
    batching = config.max_batch_size > 0
    specs: list[StateSpec] = []
    seen_initial: set[str] = set()
    for state in unique_states(config):
        datatype = protocol_from_config(state.data_type)
        initial = None
        if len(state.initial_state) > 1:
            _invalid(
                config,
                f"initial_state field for state input '{state.input_name}' must contain exactly "
                f"one or zero element. Found '{len(state.initial_state)}' elements.",
            )
        if state.initial_state:
            initial = _initial_value(config, state, model_dir, seen_initial)
        else:
            dims = [1 if d == -1 else d for d in state.dims]
            shape = ([1] if batching else []) + dims
            initial = _zeros(datatype, shape)
        specs.append(StateSpec(state.input_name, state.output_name, datatype, initial))
    return tuple(specs)


def _initial_value(
    config: ModelConfig, state: Batching.State, model_dir: Path, seen: set[str]
) -> np.ndarray:
    name = state.input_name
    initial = state.initial_state[0]
    if initial.data_type != state.data_type:
        _invalid(
            config,
            f"The data type used for 'initial_state' field of state '{name}' does not match the "
            "state data type.",
        )
    if not initial.name:
        _invalid(
            config,
            f"Field 'name' must be set when using initial_state for state input '{name}'.",
        )
    if name in seen:
        _invalid(config, f"State input name '{name}' specified more than once.")
    seen.add(name)
    if len(initial.dims) != len(state.dims):
        _invalid(
            config,
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
            f"dimensions for state input '{name}'. {len(initial.dims)} != {len(state.dims)}",
        )
    for initial_dim, state_dim in zip(initial.dims, state.dims, strict=True):
        if initial_dim == -1:
            _invalid(
                config,
                f"'initial_state' field for state input name '{name}' contains variable "
                "dimensions.",
            )
        if state_dim != -1 and initial_dim != state_dim:
            _invalid(
                config,
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim "
                f"description. {initial_dim} != {state_dim}",
            )
    shape = ([1] if config.max_batch_size > 0 else []) + list(initial.dims)
    datatype = protocol_from_config(state.data_type)
    choice = initial.WhichOneof("state_data")
    if choice == "zero_data":
        return _zeros(datatype, shape)
    if choice == "data_file":
        return _from_file(config, model_dir, initial.data_file, datatype, shape)
    _invalid(config, f"initial_state setting expects state'{name}' to have state_data set")


def _zeros(datatype: str, shape: list[int]) -> np.ndarray:
    if datatype == "BYTES":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=NUMPY_DTYPES[datatype])


def _from_file(
    config: ModelConfig, model_dir: Path, data_file: str, datatype: str, shape: list[int]
) -> np.ndarray:
    path = model_dir / INITIAL_STATE_FOLDER / data_file
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(
            model=config.name,
            reason=f"Internal: failed to open text file for read {path}: {exc.strerror}",
        ) from exc
    count = math.prod(shape)
    if datatype == "BYTES":
        return np.array(_strings(config, data, count, data_file), dtype=object).reshape(shape)
    needed = count * NUMPY_DTYPES[datatype].itemsize
    if needed > len(data):
        _invalid(
            config,
            f"initial_state setting expects {needed} bytes, but the data provided from "
            f"{data_file}only has {len(data)} bytes.",
        )
    dtype = NUMPY_DTYPES[datatype].newbyteorder("<")
    return np.frombuffer(data[:needed], dtype=dtype).astype(NUMPY_DTYPES[datatype]).reshape(shape)


def _strings(config: ModelConfig, data: bytes, count: int, data_file: str) -> list[bytes]:
    """Triton's serialized string tensor: each element its uint32 length, then its bytes."""
    values: list[bytes] = []
    offset = 0
    while len(values) < count:
        if offset + 4 > len(data):
            break
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + length > len(data):
            break
        values.append(data[offset : offset + length])
        offset += length
    if len(values) != count:
        _invalid(
            config,
            f"initial_state data file {data_file} holds {len(values)} complete strings where "
            f"the state has {count} elements",
        )
    return values


def _invalid(config: ModelConfig, text: str) -> NoReturn:
    raise ModelLoadError(model=config.name, reason=f"Invalid argument: {text}")
