"""Control tensors as Triton sets them: each boolean form's values per flag, the filler row,
shapes with and without a batch dimension, and CORRID in every allowed datatype (the numeric
encodings of string IDs checked against what Triton 2.51 gave its model)."""

from __future__ import annotations

import numpy as np
import pytest

from data_plane.sequence.controls import ControlTensors
from data_plane.sequence.table import END, START
from foundation.sequence_config import CORRID, END as END_KIND, READY, START as START_KIND, Control

CONTROLS = (
    Control(START_KIND, "S", "INT32", 0, 1),
    Control(END_KIND, "E", "FP32", 0.0, 1.0),
    Control(READY, "R", "BOOL", False, True),
    Control(CORRID, "C", "UINT64"),
)


@pytest.mark.parametrize(
    ("flags", "start", "end"),
    [
        pytest.param(START, 1, 0.0, id="start"),
        pytest.param(0, 0, 0.0, id="continue"),
        pytest.param(END, 0, 1.0, id="end"),
        pytest.param(START | END, 1, 1.0, id="start-end"),
    ],
)
def test_flags_set_start_and_end(flags: int, start: int, end: float) -> None:
    tensors = ControlTensors(CONTROLS, batching=True).for_rows([(flags, 9)])
    assert tensors["S"].tolist() == [[start]] and tensors["S"].dtype == np.int32
    assert tensors["E"].tolist() == [[end]] and tensors["E"].dtype == np.float32
    assert tensors["R"].tolist() == [[True]] and tensors["R"].dtype == np.bool_
    assert tensors["C"].tolist() == [[9]] and tensors["C"].dtype == np.uint64


def test_a_filler_row_is_not_ready_with_corrid_zero() -> None:
    tensors = ControlTensors(CONTROLS, batching=True).for_rows([None, (START, 4)])
    assert tensors["S"].tolist() == [[0], [1]]
    assert tensors["R"].tolist() == [[False], [True]]
    assert tensors["C"].tolist() == [[0], [4]]


def test_custom_false_true_values() -> None:
    controls = (Control(START_KIND, "S", "INT32", 7, -7), Control(READY, "R", "FP32", 0.5, 2.5))
    tensors = ControlTensors(controls, batching=True).for_rows([(START, 1), (0, 2), None])
    assert tensors["S"].tolist() == [[-7], [7], [7]]
    assert tensors["R"].tolist() == [[2.5], [2.5], [0.5]]


def test_without_batching_each_tensor_has_shape_one() -> None:
    tensors = ControlTensors(CONTROLS, batching=False).for_rows([(START, 3)])
    assert {name: t.shape for name, t in tensors.items()} == {n: (1,) for n in "SERC"}


@pytest.mark.parametrize(
    ("datatype", "correlation_id", "expected"),
    [
        pytest.param("UINT64", 12345678901234, 12345678901234, id="uint64"),
        pytest.param("INT64", 2**64 - 5, -5, id="int64-reads-the-same-bytes"),
        pytest.param("INT32", 12345678901234, 1942892530, id="int32-low-bytes-as-triton"),
        pytest.param("UINT32", 2**32 + 7, 7, id="uint32-low-bytes"),
        pytest.param("UINT64", "abc", 27974191445704707, id="string-into-uint64-as-triton"),
        pytest.param("INT32", "xyz", 3, id="string-into-int32-is-its-length-as-triton"),
        pytest.param("BYTES", "abc", b"abc", id="string-into-string"),
        pytest.param("BYTES", 42, b"42", id="uint64-into-string-as-text"),
    ],
)
def test_corrid_encodings(datatype: str, correlation_id: int | str, expected: object) -> None:
    controls = (Control(CORRID, "C", datatype),)
    tensor = ControlTensors(controls, batching=True).for_rows([(START, correlation_id)])["C"]
    assert tensor.tolist() == [[expected]]


def test_corrid_of_a_filler_string_tensor_is_empty() -> None:
    controls = (Control(CORRID, "C", "BYTES"),)
    assert ControlTensors(controls, batching=True).for_rows([None])["C"].tolist() == [[b""]]


@pytest.mark.parametrize("batching", [True, False])
def test_one_request_gets_the_same_tensors_as_a_row(batching: bool) -> None:
    tensors = ControlTensors(CONTROLS, batching=batching)
    for flags in (START, 0, END, START | END):
        for cid in (3, "abc"):
            one = tensors.for_request(flags, cid)
            row = tensors.for_rows([(flags, cid)])
            assert {n: (t.dtype, t.shape, t.tolist()) for n, t in one.items()} == {
                n: (t.dtype, t.shape, t.tolist()) for n, t in row.items()
            }
    shared = tensors.for_request(START, 1)["S"]
    assert shared is tensors.for_request(START, 2)["S"]  # made once per flags value
    assert not shared.flags.writeable
