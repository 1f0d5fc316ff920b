"""Inputs from V2 metadata: shapes, generated values and the --input-data file format."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from zeroserve.bench.inputs import (
    InputError,
    Tensor,
    TensorSpec,
    generated_tensors,
    input_data_requests,
    is_batching,
    load_input_data,
    parse_metadata,
    request_shape,
)

METADATA = {
    "name": "m",
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "INPUT1", "datatype": "BYTES", "shape": [-1, 2]},
    ],
}


def test_metadata_gives_the_inputs():
    specs = parse_metadata(METADATA)
    assert specs == [
        TensorSpec("INPUT0", "FP32", (-1, 4)),
        TensorSpec("INPUT1", "BYTES", (-1, 2)),
    ]


@pytest.mark.parametrize(
    "document",
    [
        pytest.param({}, id="no inputs key"),
        pytest.param({"inputs": []}, id="no inputs"),
        pytest.param({"inputs": [{"name": "x", "datatype": "FP99", "shape": [1]}]}, id="dtype"),
        pytest.param({"inputs": [{"name": "x", "datatype": "FP32"}]}, id="no shape"),
    ],
)
def test_unusable_metadata_is_refused(document):
    with pytest.raises(InputError):
        parse_metadata(document)


def test_batching_from_config_or_leading_minus_one():
    specs = [TensorSpec("a", "FP32", (-1, 4))]
    assert is_batching(specs, None)
    assert not is_batching(specs, {"max_batch_size": 0})
    assert is_batching([TensorSpec("a", "FP32", (3, 4))], {"max_batch_size": 8})
    assert not is_batching([TensorSpec("a", "FP32", (3, 4))], None)


def test_request_shapes():
    spec = TensorSpec("a", "FP32", (-1, 4))
    assert request_shape(spec, batch_size=8, is_batched=True, overrides={}) == (8, 4)
    variable = TensorSpec("a", "FP32", (-1, -1, 3))
    with pytest.raises(InputError, match="--shape a:N,3"):
        request_shape(variable, batch_size=1, is_batched=True, overrides={})
    shape = request_shape(variable, batch_size=2, is_batched=True, overrides={"a": (5, 3)})
    assert shape == (2, 5, 3)
    with pytest.raises(InputError, match="batch"):
        request_shape(TensorSpec("a", "FP32", (4,)), batch_size=2, is_batched=False, overrides={})


@pytest.mark.parametrize(
    "datatype",
    ["BOOL", "UINT8", "INT32", "INT64", "FP16", "FP32", "FP64", "BF16", "BYTES"],
)
def test_random_values_are_seeded_and_typed(datatype):
    spec = TensorSpec("x", datatype, (-1, 3))

    def make(seed: int) -> Tensor:
        [tensor] = generated_tensors(
            [spec], fill="random", batch_size=2, is_batched=True, overrides={}, seed=seed
        )
        return tensor

    first, again, other = make(1), make(1), make(2)
    assert first.shape == (2, 3)
    assert first.array.tolist() == again.array.tolist()
    if datatype != "BOOL":
        assert first.array.tolist() != other.array.tolist()
    if datatype == "BYTES":
        assert all(isinstance(v, bytes) and len(v) == 8 for v in first.array.ravel())


def test_zero_fill():
    specs = [TensorSpec("x", "INT32", (-1, 2)), TensorSpec("s", "BYTES", (-1, 1))]
    tensors = generated_tensors(
        specs, fill="zero", batch_size=1, is_batched=True, overrides={}, seed=0
    )
    assert tensors[0].array.tolist() == [[0, 0]]
    assert tensors[1].array.tolist() == [[b""]]


def test_input_data_file_forms(tmp_path):
    specs = parse_metadata(METADATA)
    document = {
        "data": [
            {"INPUT0": [1, 2, 3, 4], "INPUT1": ["a", "b"]},
            {"INPUT0": {"content": [[5, 6], [7, 8]], "shape": [4]}, "INPUT1": [["c"], ["d"]]},
            {
                "INPUT0": {"b64": base64.b64encode(np.arange(4, dtype="<f4").tobytes()).decode()},
                "INPUT1": {"content": ["e", "f"]},
            },
        ]
    }
    path = tmp_path / "data.json"
    path.write_text(json.dumps(document))
    requests = load_input_data(path, specs, batch_size=1, is_batched=True, overrides={})
    assert len(requests) == 3
    assert requests[0][0].array.tolist() == [[1.0, 2.0, 3.0, 4.0]]
    assert requests[1][0].array.tolist() == [[5.0, 6.0, 7.0, 8.0]]
    assert requests[2][0].array.tolist() == [[0.0, 1.0, 2.0, 3.0]]
    assert requests[1][1].array.tolist() == [[b"c", b"d"]]


def test_a_batch_takes_consecutive_samples_wrapping_around():
    specs = [TensorSpec("x", "INT32", (-1, 1))]
    document = {"data": [{"x": [1]}, {"x": [2]}, {"x": [3]}]}
    requests = input_data_requests(document, specs, batch_size=2, is_batched=True, overrides={})
    assert [r[0].array.ravel().tolist() for r in requests] == [[1, 2], [2, 3], [3, 1]]


def test_one_unknown_dimension_is_inferred():
    specs = [TensorSpec("x", "FP32", (-1, -1))]
    [[tensor]] = input_data_requests(
        {"data": [{"x": [1, 2, 3]}]}, specs, batch_size=1, is_batched=True, overrides={}
    )
    assert tensor.shape == (1, 3)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        pytest.param([], "must be", id="not an object"),
        pytest.param({"data": []}, "must be", id="empty data"),
        pytest.param({"data": [{"other": [1]}]}, "no value for 'x'", id="missing input"),
        pytest.param({"data": [{"x": [1, 2, 3]}]}, "do not fit", id="wrong count"),
        pytest.param({"data": [{"x": {"b64": "!!"}}]}, "base64", id="bad base64"),
        pytest.param({"data": [{"x": {"shape": [2]}}]}, "content", id="no content"),
        pytest.param({"data": [{"x": ["a", "b"]}]}, "not FP32", id="wrong type"),
    ],
)
def test_bad_input_data_says_what_is_wrong(document, message):
    specs = [TensorSpec("x", "FP32", (-1, 2))]
    with pytest.raises(InputError, match=message):
        input_data_requests(document, specs, batch_size=1, is_batched=True, overrides={})
