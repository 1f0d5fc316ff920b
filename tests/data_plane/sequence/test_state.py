"""Implicit state: initial values (zeros, files in the model's ``initial_state`` folder, strings)
and Triton's load-time refusals with its texts (observed on Triton 2.51 as the version's
UNAVAILABLE reason), then a sequence's state reset and carried over."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from data_plane.errors import ModelLoadError
from data_plane.sequence import read_states
from data_plane.sequence.state import SequenceState
from foundation.proto.model_config_pb2 import ModelConfig


def config(states: str, *, max_batch_size: int = 2) -> ModelConfig:
    return text_format.Parse(
        f'name: "acc" max_batch_size: {max_batch_size} sequence_batching {{ state [ {states} ] }}',
        ModelConfig(),
    )


def state(dims: str = "[2]", initial: str = "", datatype: str = "TYPE_INT32") -> str:
    body = f'input_name: "SI" output_name: "SO" data_type: {datatype} dims: {dims}'
    return f"{{ {body} {initial} }}"


def init(body: str) -> str:
    return f"initial_state [ {body} ]"


def test_without_initial_state_a_state_starts_at_zeros_with_a_batch_row() -> None:
    (spec,) = read_states(config(state("[2, -1]")), Path("/nonexistent"))
    assert spec.initial.shape == (1, 2, 1)
    assert spec.initial.dtype == np.int32 and not spec.initial.any()
    (plain,) = read_states(config(state("[3]"), max_batch_size=0), Path("/nonexistent"))
    assert plain.initial.shape == (3,)


def test_zero_data_and_data_file(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "init.bin").write_bytes(struct.pack("<3i", 7, 9, 11))
    zero = init('{ data_type: TYPE_INT32 dims: [2] zero_data: true name: "z" }')
    (spec,) = read_states(config(state(initial=zero)), tmp_path)
    assert spec.initial.tolist() == [[0, 0]]
    from_file = init('{ data_type: TYPE_INT32 dims: [2] data_file: "init.bin" name: "f" }')
    (spec,) = read_states(config(state(initial=from_file)), tmp_path)
    assert spec.initial.tolist() == [[7, 9]]  # the file may hold more than the state needs


def test_string_state_from_a_file_in_tritons_serialized_form(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    data = b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b""))
    (tmp_path / "initial_state" / "s.bin").write_bytes(data)
    initial = init('{ data_type: TYPE_STRING dims: [2] data_file: "s.bin" name: "s" }')
    (spec,) = read_states(config(state(initial=initial, datatype="TYPE_STRING")), tmp_path)
    assert spec.initial.tolist() == [[b"ab", b""]]
    (zeros,) = read_states(config(state(datatype="TYPE_STRING")), tmp_path)
    assert zeros.initial.tolist() == [[b"", b""]]


@pytest.mark.parametrize(
    ("dims", "initial", "reason"),
    [
        pytest.param(
            "[1]",
            init(
                '{ data_type: TYPE_INT32 dims: [1] zero_data: true name: "a" }, '
                '{ data_type: TYPE_INT32 dims: [1] zero_data: true name: "b" }'
            ),
            "initial_state field for state input 'SI' must contain exactly one or zero element. "
            "Found '2' elements.",
            id="two-initial-states",
        ),
        pytest.param(
            "[1]",
            init('{ data_type: TYPE_FP32 dims: [1] zero_data: true name: "a" }'),
            "The data type used for 'initial_state' field of state 'SI' does not match the "
            "state data type.",
            id="datatype",
        ),
        pytest.param(
            "[1]",
            init("{ data_type: TYPE_INT32 dims: [1] zero_data: true }"),
            "Field 'name' must be set when using initial_state for state input 'SI'.",
            id="no-name",
        ),
        pytest.param(
            "[1]",
            init('{ data_type: TYPE_INT32 dims: [1, 2] zero_data: true name: "a" }'),
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
            "dimensions for state input 'SI'. 2 != 1",
            id="rank",
        ),
        pytest.param(
            "[-1]",
            init('{ data_type: TYPE_INT32 dims: [-1] zero_data: true name: "a" }'),
            "'initial_state' field for state input name 'SI' contains variable dimensions.",
            id="variable-dims",
        ),
        pytest.param(
            "[2]",
            init('{ data_type: TYPE_INT32 dims: [3] zero_data: true name: "a" }'),
            "'initial_state' dim for input name 'SI' doesn't match 'state' dim description. 3 != 2",
            id="dims",
        ),
        pytest.param(
            "[1]",
            init('{ data_type: TYPE_INT32 dims: [1] name: "a" }'),
            "initial_state setting expects state'SI' to have state_data set",
            id="no-data",
        ),
        pytest.param(
            "[4]",
            init('{ data_type: TYPE_INT32 dims: [4] data_file: "init.bin" name: "a" }'),
            "initial_state setting expects 16 bytes, but the data provided from init.binonly "
            "has 8 bytes.",
            id="short-file",
        ),
    ],
)
def test_tritons_refusals(tmp_path: Path, dims: str, initial: str, reason: str) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "init.bin").write_bytes(bytes(8))
    with pytest.raises(ModelLoadError) as caught:
        read_states(config(state(dims, initial)), tmp_path)
    assert caught.value.reason == f"Invalid argument: {reason}"


def test_a_missing_file_is_an_internal_reason_naming_it(tmp_path: Path) -> None:
    initial = init('{ data_type: TYPE_INT32 dims: [1] data_file: "missing.bin" name: "a" }')
    with pytest.raises(ModelLoadError) as caught:
        read_states(config(state("[1]", initial)), tmp_path)
    path = tmp_path / "initial_state" / "missing.bin"
    assert caught.value.reason == (
        f"Internal: failed to open text file for read {path}: No such file or directory"
    )


def test_a_repeated_state_name_is_ignored_as_triton_does() -> None:
    twice = state() + ', { input_name: "SI" output_name: "OTHER" data_type: TYPE_INT32 dims: [9] }'
    assert [s.output_name for s in read_states(config(twice), Path("/nonexistent"))] == ["SO"]


def test_a_sequence_state_resets_and_keeps_what_the_model_produced() -> None:
    specs = read_states(config(state()), Path("/nonexistent"))
    current = SequenceState(specs)
    produced = np.array([[5, 6], [7, 8]], dtype=np.int32)
    current.update({"SO": produced[1:2], "OTHER": produced})
    produced[1, 0] = 0  # the batch's output may be reused: the state kept its own copy
    assert current.values["SI"].tolist() == [[7, 8]]
    current.update({"OUTPUT": produced})  # no state output: the state stays
    assert current.values["SI"].tolist() == [[7, 8]]
    current.reset()
    assert current.values["SI"].tolist() == [[0, 0]]
