"""The infer codec against the real tritonclient (2.73) on both sides of the wire.

Requests are built by ``tritonclient.http._utils._get_inference_request`` (what
``InferenceServerClient.infer`` sends) or by hand for the error paths; responses are read back
with ``tritonclient.http._infer_result.InferResult.from_response_body`` (what the client does with
a 200). Error texts are asserted exactly: tools match on Triton's wording.
"""

from __future__ import annotations

from typing import Any, Literal

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as triton_http
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.http._infer_result import InferResult
from tritonclient.http._utils import _get_inference_request

from data_plane import protocol
from data_plane.errors import InvalidArgumentError
from data_plane.protocol import (
    RAW_INPUT_NAME,
    InferInput,
    OutputTensor,
    RequestedOutput,
    SharedMemoryRef,
    bind_raw_input,
    classify,
    decode_infer_request,
    encode_infer_response,
    parse_header_length,
)
from data_plane.shared_memory import SharedMemoryRequestError
from foundation.datatypes import NUMPY_DTYPES

ALL_TYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
]
JSON_INPUT_TYPES = [t for t in ALL_TYPES if t not in ("FP16", "BF16")]
NUMERIC_TYPES = [t for t in ALL_TYPES if t != "BYTES"]
NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
PROPERTY = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow],
)
NO_ID = "[request id: <id_unknown>] "


# --- helpers ---------------------------------------------------------------------------------


def sample(datatype: str, shape: tuple[int, ...], *, seed: int = 0, text: bool = False) -> Any:
    """Server-form data for ``datatype`` (BF16: float32 holding bf16 values)."""
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    if datatype == "BYTES":
        pool = [b"", b"a", b"hello", "h\u00e9llo".encode(), b"\x00\x01", b"\xff\xfe" * 3]
        if text:
            pool = pool[:4]
        values = np.empty(size, dtype=object)
        values[:] = [pool[i % len(pool)] for i in rng.permutation(size)]
        return values.reshape(shape)
    if datatype == "BF16":
        return to_bf16(rng.standard_normal(shape).astype(np.float32) * 100).astype(np.float32)
    dtype = NUMPY[datatype]
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if datatype.startswith(("INT", "UINT")):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 100).astype(dtype)


def to_bf16(values: Any) -> Any:
    with np.errstate(invalid="ignore"):  # ml_dtypes warns on NaN payloads
        return np.asarray(values, dtype=np.float32).astype(ml_dtypes.bfloat16)


def client_input(name: str, datatype: str, data: Any, *, binary: bool) -> Any:
    tensor = triton_http.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(to_bf16(data) if datatype == "BF16" else data, binary_data=binary)
    return tensor


def client_request(
    inputs: list[Any],
    outputs: list[Any] | None = None,
    *,
    request_id: str = "",
    sequence_id: int | str = 0,
    priority: int = 0,
    timeout: int | None = None,
    parameters: dict[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    return _get_inference_request(  # type: ignore[no-any-return]
        inputs, request_id, outputs, sequence_id, True, False, priority, timeout, parameters
    )


def build(header: dict[str, Any], *binary: bytes) -> tuple[bytes, int]:
    head = orjson.dumps(header)
    return b"".join([head, *binary]), len(head)


def decode(header: dict[str, Any], *binary: bytes, **kwargs: Any) -> protocol.InferRequest:
    body, length = build(header, *binary)
    kwargs.setdefault("header_length", length)
    return decode_infer_request(body, model="m", **kwargs)


def one_input(**fields: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "X", **fields}]}


def read(body: bytes, header_length: int | None) -> Any:
    return InferResult.from_response_body(body, header_length=header_length)


def assert_same(actual: Any, expected: Any) -> None:
    assert actual.shape == expected.shape
    if expected.dtype == object:
        assert actual.dtype == object
        assert actual.tolist() == expected.tolist()
    else:
        assert actual.dtype == expected.dtype
        assert actual.tobytes() == expected.tobytes()


# --- requests from the real client -----------------------------------------------------------


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_binary_input_from_client_round_trips(datatype: str) -> None:
    data = sample(datatype, (2, 3))
    body, length = client_request([client_input("X", datatype, data, binary=True)])
    request = decode_infer_request(body, header_length=length, model="m")
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("X", datatype, (2, 3))
    assert_same(tensor.data, data)


@pytest.mark.parametrize("datatype", JSON_INPUT_TYPES)
def test_json_input_from_client_round_trips(datatype: str) -> None:
    data = sample(datatype, (2, 3), text=True)
    body, length = client_request([client_input("X", datatype, data, binary=False)])
    assert length is None  # no binary input: the whole body is JSON, no header sent
    request = decode_infer_request(body, header_length=None, model="m")
    assert_same(request.inputs[0].data, data)


def test_client_request_with_everything() -> None:
    fp32 = sample("FP32", (1, 4))
    words = np.array([b"ab", b"c"], dtype=object)
    ints = np.arange(6, dtype=np.int32).reshape(2, 3)
    inputs = [
        client_input("IN", "FP32", fp32, binary=True),
        client_input("S", "BYTES", words, binary=True),
        client_input("J", "INT32", ints, binary=False),
    ]
    outputs = [
        triton_http.InferRequestedOutput("OUT", binary_data=False),
        triton_http.InferRequestedOutput("CLS", class_count=3),
    ]
    body, length = client_request(
        inputs,
        outputs,
        request_id="42",
        sequence_id=7,
        priority=2,
        timeout=1500,
        parameters={"foo": 1, "bar": "x", "ok": True, "ratio": 0.5},
    )
    request = decode_infer_request(body, header_length=length, model="m")
    assert request.id == "42"
    assert [i.name for i in request.inputs] == ["IN", "S", "J"]
    assert_same(request.inputs[0].data, fp32)
    assert_same(request.inputs[1].data, words)
    assert_same(request.inputs[2].data, ints)
    assert request.outputs == [
        RequestedOutput("OUT", binary_data=False),
        RequestedOutput("CLS", binary_data=True, classification=3),
    ]
    assert (request.priority, request.timeout_us, request.binary_data_output) == (2, 1500, False)
    assert request.parameters == {
        "sequence_id": 7,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 2,
        "timeout": 1500,
        "foo": 1,
        "bar": "x",
        "ok": True,
        "ratio": 0.5,
    }


def test_client_request_without_outputs_asks_for_binary() -> None:
    body, length = client_request([client_input("X", "INT32", sample("INT32", (3,)), binary=True)])
    request = decode_infer_request(body, header_length=length, model="m")
    assert request.outputs is None
    assert request.binary_data_output is True
    assert (request.id, request.priority, request.timeout_us) == (None, 0, 0)


def test_string_sequence_id_is_kept() -> None:
    body, _ = client_request(
        [client_input("X", "INT32", sample("INT32", (1,)), binary=False)], sequence_id="abc"
    )
    assert (
        decode_infer_request(body, header_length=None, model="m").parameters["sequence_id"] == "abc"
    )


def test_binary_inputs_are_zero_copy_views() -> None:
    data = sample("FP32", (4, 4))
    body, length = client_request([client_input("X", "FP32", data, binary=True)])
    tensor = decode_infer_request(body, header_length=length, model="m").inputs[0]
    assert not tensor.data.flags.writeable
    assert np.shares_memory(tensor.data, np.frombuffer(body, dtype=np.uint8))


def test_body_may_be_a_memoryview() -> None:
    body, length = build(one_input(datatype="INT8", shape=[2], parameters={"binary_data_size": 2}))
    request = decode_infer_request(memoryview(body + b"\x01\xff"), header_length=length, model="m")
    assert request.inputs[0].data.tolist() == [1, -1]


# --- hand-built requests ---------------------------------------------------------------------


def test_nested_json_data() -> None:
    request = decode(one_input(datatype="FP32", shape=[2, 2], data=[[1, 2.5], [3, 4]]))
    assert request.inputs[0].data.tolist() == [[1.0, 2.5], [3.0, 4.0]]


def test_ragged_nesting_counts_leaves_as_triton_does() -> None:
    request = decode(one_input(datatype="INT64", shape=[3], data=[1, [2, [3]]]))
    assert request.inputs[0].data.tolist() == [1, 2, 3]


def nested(levels: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def test_nesting_just_under_the_limit_is_accepted() -> None:
    request = decode(one_input(datatype="INT32", shape=[1], data=nested(99, 5)))
    assert request.inputs[0].data.tolist() == [5]


@pytest.mark.parametrize(
    ("datatype", "leaf", "message"),
    [
        (
            "INT32",
            5,
            "Unable to parse 'data': JSON nesting depth exceeds maximum allowed limit (100)",
        ),
        ("BYTES", "a", "JSON nesting depth exceeds maximum allowed limit (100)"),
    ],
)
def test_nesting_at_the_limit_is_refused(datatype: str, leaf: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        decode(one_input(datatype=datatype, shape=[1], data=nested(100, leaf)))
    assert info.value.message == message


def test_bool_and_bytes_json() -> None:
    request = decode(
        {
            "inputs": [
                {"name": "B", "datatype": "BOOL", "shape": [3], "data": [True, False, True]},
                {"name": "S", "datatype": "BYTES", "shape": [2], "data": ["h\u00e9", ""]},
            ]
        }
    )
    assert request.inputs[0].data.dtype == np.bool_
    assert request.inputs[0].data.tolist() == [True, False, True]
    assert request.inputs[1].data.tolist() == ["h\u00e9".encode(), b""]


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_zero_element_tensors(datatype: str) -> None:
    binary = {
        "name": "B",
        "datatype": datatype,
        "shape": [0, 3],
        "parameters": {"binary_data_size": 0},
    }
    inputs = [binary]
    if datatype in JSON_INPUT_TYPES:
        inputs.append({"name": "J", "datatype": datatype, "shape": [2, 0], "data": []})
    request = decode({"inputs": inputs})
    assert request.inputs[0].data.shape == (0, 3)
    assert request.inputs[-1].data.size == 0
    assert request.inputs[0].data.dtype == NUMPY_DTYPES[datatype]


def shaped_input(datatype: str, shape: list[int], *, binary: bool) -> dict[str, Any]:
    """An input of ``shape`` with no elements' worth of data, sent as JSON or binary."""
    if binary:
        return one_input(datatype=datatype, shape=shape, parameters={"binary_data_size": 0})
    return one_input(datatype=datatype, shape=shape, data=[])


TOO_LARGE = (
    NO_ID + "input 'X' has shape {shape}, too large to hold: its non-zero dimensions times "
    "the {datatype} element size exceed 9223372036854775807"
)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize(
    ("datatype", "shape", "message"),
    [
        pytest.param("FP32", [0, 2**63], TOO_LARGE, id="dim-past-int64"),
        pytest.param("BOOL", [2**63, 0], TOO_LARGE, id="dim-past-int64-first"),
        pytest.param("FP32", [0, 2**62], TOO_LARGE, id="bytes-past-int64"),
        pytest.param("BYTES", [0, 2**40, 2**40], TOO_LARGE, id="product-past-int64"),
        pytest.param(
            "INT8",
            [1] * 65,
            NO_ID + "input 'X' has 65 dimensions, more than the 64 supported",
            id="65-dims",
        ),
        pytest.param(
            "INT8",
            [0] * 65,
            NO_ID + "input 'X' has 65 dimensions, more than the 64 supported",
            id="65-zero-dims",
        ),
    ],
)
def test_shapes_no_array_can_hold_are_refused(
    datatype: str, shape: list[int], message: str, binary: bool
) -> None:
    # These passed every size check (no elements, no data) and then failed in numpy: a 500.
    with pytest.raises(InvalidArgumentError) as info:
        decode(shaped_input(datatype, shape, binary=binary))
    assert info.value.message == message.format(shape=shape, datatype=datatype)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize(
    ("datatype", "shape"),
    [
        pytest.param("BOOL", [0, 2**63 - 1], id="largest-dim"),
        pytest.param("FP32", [2**61 - 1, 0], id="largest-fp32-dim"),
        pytest.param("INT8", [0] + [1] * 63, id="64-dims"),
    ],
)
def test_the_largest_shapes_numpy_holds_are_accepted(
    datatype: str, shape: list[int], binary: bool
) -> None:
    data = decode(shaped_input(datatype, shape, binary=binary)).inputs[0].data
    assert data.shape == tuple(shape)
    assert data.size == 0


def test_binary_bool_bytes_other_than_0_and_1_are_normalised() -> None:
    header = one_input(datatype="BOOL", shape=[3], parameters={"binary_data_size": 3})
    data = decode(header, b"\x00\x02\x01").inputs[0].data
    assert data.view(np.uint8).tolist() == [0, 1, 1]


def test_extreme_integers_in_json() -> None:
    request = decode(
        {
            "inputs": [
                {"name": "U", "datatype": "UINT64", "shape": [2], "data": [0, 2**64 - 1]},
                {"name": "I", "datatype": "INT64", "shape": [2], "data": [-(2**63), 2**63 - 1]},
                {"name": "B", "datatype": "INT8", "shape": [2], "data": [-128, 127]},
            ]
        }
    )
    assert [i.data.tolist() for i in request.inputs] == [
        [0, 2**64 - 1],
        [-(2**63), 2**63 - 1],
        [-128, 127],
    ]


def test_booleans_mixed_with_numbers_read_as_0_and_1() -> None:
    # A documented leniency of the numpy fast path: Triton refuses these.
    data = decode(one_input(datatype="INT32", shape=[3], data=[True, 2, False])).inputs[0].data
    assert data.tolist() == [1, 2, 0]


def test_fp32_overflow_becomes_inf_like_triton() -> None:
    data = decode(one_input(datatype="FP32", shape=[1], data=[1e300])).inputs[0].data
    assert np.isinf(data[0])


def test_raw_binary_request() -> None:
    request = decode_infer_request(b"\x01\x02\x03\x04", header_length=0, model="m")
    (raw,) = request.inputs
    assert (raw.name, raw.datatype, raw.shape) == (RAW_INPUT_NAME, "", ())
    assert raw.data.dtype == np.uint8 and raw.data.tolist() == [1, 2, 3, 4]
    assert request.binary_data_output is True and request.outputs is None


def test_empty_id_is_kept_and_not_echoed() -> None:
    request = decode({"id": "", "inputs": []})
    assert request.id == ""
    body, _ = encode_infer_response(
        model_name="m", model_version="1", request_id=request.id, outputs=[]
    )
    assert body == b'{"model_name":"m","model_version":"1","outputs":[]}'


# --- raw input binding -----------------------------------------------------------------------


def raw(body: bytes) -> InferInput:
    return decode_infer_request(body, header_length=0, model="m").inputs[0]


def test_bind_raw_input_deduces_the_variable_dim_and_batch() -> None:
    values = np.arange(6, dtype=np.float32)
    bound = bind_raw_input(
        raw(values.tobytes()), model="m", name="IN", datatype="FP32", dims=[-1, 3], max_batch_size=8
    )
    assert (bound.name, bound.datatype, bound.shape) == ("IN", "FP32", (1, 2, 3))
    assert_same(bound.data, values.reshape(1, 2, 3))


def test_bind_raw_input_bytes_takes_the_whole_body() -> None:
    bound = bind_raw_input(
        raw(b"\xffabc"), model="m", name="S", datatype="BYTES", dims=[1], max_batch_size=0
    )
    assert bound.shape == (1,) and bound.data.tolist() == [b"\xffabc"]


@pytest.mark.parametrize(
    ("datatype", "dims", "message"),
    [
        (
            "FP32",
            [4],
            NO_ID + "input byte size mismatch for input 'IN' for model 'm'. Expected 16, got 6",
        ),
        (
            "FP32",
            [-1],
            NO_ID + "input byte size mismatch for input 'IN' for model 'm'. Expected 4, got 6",
        ),
        (
            "INT8",
            [-1, -1],
            NO_ID + "The shape of the raw input 'IN' can not be deduced because "
            "there are more than one variable-sized dimension",
        ),
        (
            "BYTES",
            [2],
            NO_ID + "For BYTE datatype raw input 'IN', the model must have input shape [1]",
        ),
    ],
)
def test_bind_raw_input_errors(datatype: str, dims: list[int], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        bind_raw_input(
            raw(b"123456"), model="m", name="IN", datatype=datatype, dims=dims, max_batch_size=0
        )
    assert info.value.message == message


# --- request errors --------------------------------------------------------------------------

NOT_STRING = "attempt to access JSON non-string as string"
NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"
NOT_INT = "attempt to access JSON non-signed-integer as signed-integer"
NOT_BOOL = "attempt to access JSON non-boolean as boolean"
NOT_NUMBER = "attempt to access JSON non-number as double"
NOT_ARRAY = "attempt to access JSON non-array as array"
ONLY_ONE = (
    "Input must set only one of the following fields: 'data', 'binary_data_size' in "
    "'parameters', 'shared_memory_region' in 'parameters'. But "
)
BAD_PARAM = "has invalid type. It should be either 'int', 'bool', or 'string'."
SHAPE_1 = {"datatype": "FP32", "shape": [1]}
BIN4 = {"binary_data_size": 4}
X1 = {"name": "X", "datatype": "FP32", "shape": [1], "data": [1]}


def case(case_id: str, header: dict[str, Any], message: str) -> Any:
    return pytest.param(header, message, id=case_id)


def data(datatype: str, shape: Any, values: Any) -> dict[str, Any]:
    return one_input(datatype=datatype, shape=shape, data=values)


def output(**params: Any) -> dict[str, Any]:
    return {"inputs": [], "outputs": [{"name": "Y", "parameters": params}]}


REQUEST_ERRORS = [
    case("id-not-string", {"id": 5, "inputs": []}, f"Unable to parse 'id': {NOT_STRING}"),
    case(
        "parameters-not-object",
        {"parameters": [1], "inputs": []},
        "failed to get request params.: attempt to get members for non-object",
    ),
    case(
        "triton-prefix",
        {"parameters": {"triton_x": 1}},
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not "
        "be specified.",
    ),
    case(
        "priority-neg", {"parameters": {"priority": -1}}, f"Unable to parse 'priority': {NOT_UINT}"
    ),
    case(
        "priority-str", {"parameters": {"priority": "1"}}, f"Unable to parse 'priority': {NOT_UINT}"
    ),
    case(
        "timeout-float", {"parameters": {"timeout": 1.5}}, f"Unable to parse 'timeout': {NOT_UINT}"
    ),
    case(
        "timeout-bool", {"parameters": {"timeout": True}}, f"Unable to parse 'timeout': {NOT_UINT}"
    ),
    case(
        "binary-data-output-int",
        {"parameters": {"binary_data_output": 1}},
        f"Unable to parse 'binary_data_output': {NOT_BOOL}",
    ),
    case(
        "sequence-start-str",
        {"parameters": {"sequence_start": "yes"}},
        f"Unable to parse 'sequence_start': {NOT_BOOL}",
    ),
    case(
        "sequence-id-float",
        {"parameters": {"sequence_id": 1.5}},
        f"Unable to parse 'sequence_id': {NOT_STRING}",
    ),
    case("custom-null", {"parameters": {"k": None}}, f"parameter 'k' {BAD_PARAM}"),
    case("custom-list", {"parameters": {"k": [1]}}, f"parameter 'k' {BAD_PARAM}"),
    case(
        "inputs-missing",
        {},
        "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'",
    ),
    case("inputs-not-array", {"inputs": {}}, f"Unable to parse 'inputs': {NOT_ARRAY}"),
    case("no-data-field", one_input(**SHAPE_1), ONLY_ONE + "no field is set"),
    case("input-not-object", {"inputs": ["X"]}, ONLY_ONE + "no field is set"),
    case(
        "data-and-binary",
        one_input(**SHAPE_1, data=[1], parameters=BIN4),
        ONLY_ONE + "set 'data' 'binary_data_size'",
    ),
    case(
        "all-three",
        one_input(**SHAPE_1, data=[1], parameters={**BIN4, "shared_memory_region": "r"}),
        ONLY_ONE + "set 'data' 'binary_data_size' 'shared_memory_region'",
    ),
    case(
        "name-missing",
        {"inputs": [{**SHAPE_1, "data": [1]}]},
        "Unable to parse 'name': attempt to access non-existing object member 'name'",
    ),
    case("name-not-str", {"inputs": [{**X1, "name": 1}]}, f"Unable to parse 'name': {NOT_STRING}"),
    case(
        "datatype-missing",
        one_input(shape=[1], data=[1]),
        "Unable to parse 'datatype': attempt to access non-existing object member 'datatype'",
    ),
    case(
        "shape-missing",
        one_input(datatype="FP32", data=[1]),
        "Unable to parse 'shape': attempt to access non-existing object member 'shape'",
    ),
    case("shape-not-array", data("FP32", 1, [1]), f"Unable to parse 'shape': {NOT_ARRAY}"),
    case("shape-negative", data("FP32", [-1], [1]), f"Unable to parse 'shape': {NOT_UINT}"),
    case("shape-float", data("FP32", [1.0], [1]), f"Unable to parse 'shape': {NOT_UINT}"),
    case("shape-bool", data("FP32", [True], [1]), f"Unable to parse 'shape': {NOT_UINT}"),
    case(
        "duplicate-input",
        {"inputs": [X1, X1]},
        NO_ID + "input 'X' already exists in request",
    ),
    case(
        "duplicate-input-with-id",
        {"id": "7", "inputs": [X1, X1]},
        "[request id: 7] input 'X' already exists in request",
    ),
    case(
        "unknown-datatype",
        data("FLOAT", [1], [1]),
        "invalid datatype for input X: 'FLOAT' is not a protocol datatype",
    ),
    case("data-not-array", data("FP32", [1], 1), f"Unable to parse 'data': {NOT_ARRAY}"),
    case(
        "fp16-json",
        data("FP16", [1], [1]),
        "receiving FP16 data via JSON is not supported. Please use the binary data format for "
        "input X",
    ),
    case(
        "bf16-json",
        data("BF16", [1], [1]),
        "receiving BF16 data via JSON is not supported. Please use the binary data format for "
        "input X",
    ),
    case(
        "json-too-many",
        data("INT32", [2], [1, 2, 3]),
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    ),
    case(
        "json-too-few",
        data("INT32", [2, 2], [[1, 2], [3]]),
        "Failed to parse 'data' field: shape does not match true shape",
    ),
    case("int-float", data("INT32", [1], [1.5]), f"Unable to parse 'data': {NOT_INT}"),
    case("int-bool", data("INT32", [1], [True]), f"Unable to parse 'data': {NOT_INT}"),
    case("int-null", data("INT32", [1], [None]), f"Unable to parse 'data': {NOT_INT}"),
    case("uint-negative", data("UINT8", [1], [-1]), f"Unable to parse 'data': {NOT_UINT}"),
    case(
        "uint8-300",
        data("UINT8", [2], [1, 300]),
        "Unable to parse 'data': value 300 of input 'X' is out of range for UINT8",
    ),
    case(
        "int8-low",
        data("INT8", [2], [-129, 0]),
        "Unable to parse 'data': value -129 of input 'X' is out of range for INT8",
    ),
    case(
        "int64-high",
        data("INT64", [1], [2**63]),
        "Unable to parse 'data': value 9223372036854775808 of input 'X' is out of range for INT64",
    ),
    case("fp32-string", data("FP32", [1], ["1"]), f"Unable to parse 'data': {NOT_NUMBER}"),
    case("fp64-bool", data("FP64", [1], [False]), f"Unable to parse 'data': {NOT_NUMBER}"),
    case("bool-int", data("BOOL", [1], [1]), f"Unable to parse 'data': {NOT_BOOL}"),
    case(
        "bytes-int",
        data("BYTES", [1], [1]),
        f"Unable to parse JSON bytes array: {NOT_STRING}",
    ),
    case(
        "bytes-json-too-many",
        data("BYTES", [1], ["a", "b"]),
        NO_ID + "unexpected number of string elements 2 for inference input 'X' for model 'm', "
        "expecting 1",
    ),
    case(
        "bytes-json-too-few",
        data("BYTES", [3], ["a"]),
        NO_ID + "expected 3 string elements for inference input 'X' for model 'm', got 1",
    ),
    case(
        "binary-size-negative",
        one_input(**SHAPE_1, parameters={"binary_data_size": -4}),
        f"Unable to parse 'binary_data_size': {NOT_UINT}",
    ),
    case(
        "outputs-not-array",
        {"inputs": [], "outputs": {}},
        f"Unable to parse 'outputs': {NOT_ARRAY}",
    ),
    case(
        "output-name-missing",
        {"inputs": [], "outputs": [{}]},
        "Unable to parse 'name': attempt to access non-existing object member 'name'",
    ),
    case(
        "duplicate-output",
        {"inputs": [], "outputs": [{"name": "Y"}, {"name": "Y"}]},
        NO_ID + "output 'Y' already exists in request",
    ),
    case(
        "classification-negative",
        output(classification=-1),
        f"Unable to set 'classification': {NOT_UINT}",
    ),
    case("binary-data-int", output(binary_data=1), f"Unable to parse 'binary_data': {NOT_BOOL}"),
    case(
        "shm-and-classification",
        output(shared_memory_region="r", classification=1),
        "Output can't set both 'shared_memory_region' and 'classification'",
    ),
    case(
        "shm-and-binary",
        output(shared_memory_region="r", binary_data=True),
        "Output can't set both 'shared_memory_region' and 'binary_data'",
    ),
]


@pytest.mark.parametrize(("header", "message"), REQUEST_ERRORS)
def test_request_errors(header: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        decode(header)
    assert type(info.value) is InvalidArgumentError
    assert info.value.message == message


def test_shared_memory_places_are_parsed_not_read() -> None:
    header = {
        "inputs": [
            {
                "name": "X",
                "datatype": "FP32",
                "shape": [1, 2],
                "parameters": {
                    "shared_memory_region": "in",
                    "shared_memory_offset": 8,
                    "shared_memory_byte_size": 8,
                },
            },
            {"name": "Z", "datatype": "INT32", "shape": [1], "data": [3]},
        ],
        "outputs": [
            {"name": "Y", "parameters": {"shared_memory_region": "out"}},
            {"name": "W", "parameters": {"binary_data": False}},
        ],
    }
    request = decode(header)
    assert request.uses_shared_memory
    x, z = request.inputs
    assert x.shared_memory == SharedMemoryRef("in", 8, 8)
    assert x.shape == (1, 2) and x.data.size == 0
    assert z.shared_memory is None and z.data.tolist() == [3]
    assert request.outputs is not None
    y, w = request.outputs
    assert y.shared_memory == SharedMemoryRef("out", 0, 0)  # the bounds check refuses 0 later
    assert w.shared_memory is None and w.binary_data is False


def test_a_request_without_shared_memory_says_so() -> None:
    request = decode(one_input(datatype="INT32", shape=[1], data=[1]))
    assert not request.uses_shared_memory
    assert request.inputs[0].shared_memory is None


def test_an_output_in_shared_memory_is_sent_without_data() -> None:
    # Triton's answer: the output's name, datatype and shape, and nothing else.
    place = SharedMemoryRef("out", 0, 16)
    outputs = [
        OutputTensor("Y", "INT32", np.arange(4, dtype=np.int32).reshape(1, 4), True, place),
        OutputTensor("W", "INT32", np.arange(2, dtype=np.int32), False),
    ]
    body, json_length = encode_infer_response(
        model_name="m", model_version="1", request_id=None, outputs=outputs
    )
    assert json_length is None
    assert orjson.loads(body)["outputs"] == [
        {"name": "Y", "datatype": "INT32", "shape": [1, 4]},
        {"name": "W", "datatype": "INT32", "shape": [2], "data": [0, 1]},
    ]


SHM_PARAMETER_ERRORS = [
    pytest.param(
        one_input(datatype="FP32", shape=[1], parameters={"shared_memory_region": 5}),
        "Unable to parse 'shared_memory_region': attempt to access JSON non-string as string",
        id="input-region-int",
    ),
    pytest.param(
        one_input(
            datatype="FP32",
            shape=[1],
            parameters={"shared_memory_region": "r", "shared_memory_offset": -1},
        ),
        "Unable to parse 'shared_memory_offset': " + NOT_UINT,
        id="input-offset-negative",
    ),
    pytest.param(
        one_input(
            datatype="FP32",
            shape=[1],
            parameters={"shared_memory_region": "r", "shared_memory_byte_size": "4"},
        ),
        "Unable to parse 'shared_memory_byte_size': " + NOT_UINT,
        id="input-size-string",
    ),
    pytest.param(
        one_input(
            datatype="FP32",
            shape=[1],
            parameters={"shared_memory_region": "r", "shared_memory_byte_size": True},
        ),
        "Unable to parse 'shared_memory_byte_size': " + NOT_UINT,
        id="input-size-bool",
    ),
    pytest.param(
        {"inputs": [], "outputs": [{"name": "Y", "parameters": {"shared_memory_region": None}}]},
        "Unable to parse 'shared_memory_region': attempt to access JSON non-string as string",
        id="output-region-null",
    ),
    pytest.param(
        {
            "inputs": [],
            "outputs": [
                {
                    "name": "Y",
                    "parameters": {"shared_memory_region": "r", "shared_memory_offset": 1.5},
                }
            ],
        },
        "Unable to parse 'shared_memory_offset': " + NOT_UINT,
        id="output-offset-float",
    ),
]


@pytest.mark.parametrize(("header", "message"), SHM_PARAMETER_ERRORS)
def test_shared_memory_parameter_errors(header: dict[str, Any], message: str) -> None:
    # Triton answers these as INTERNAL (500), so the error is not an InvalidArgumentError.
    with pytest.raises(SharedMemoryRequestError) as info:
        decode(header)
    assert info.value.message == message


BINARY_ERRORS = [
    pytest.param(
        one_input(datatype="FP32", shape=[2], parameters={"binary_data_size": 8}),
        b"1234",
        "unexpected size for input 'X', expecting 4 additional bytes for model 'm'",
        id="short",
    ),
    pytest.param(
        one_input(datatype="FP32", shape=[1], parameters=BIN4),
        b"12345",
        "unexpected additional input data for model 'm'",
        id="leftover",
    ),
    pytest.param(
        one_input(datatype="FP32", shape=[16], parameters={"binary_data_size": 60}),
        bytes(60),
        NO_ID + "input byte size mismatch for input 'X' for model 'm'. Expected 64, got 60",
        id="size-mismatch",
    ),
    pytest.param(
        {"id": "r1", **one_input(datatype="INT8", shape=[3], parameters=BIN4)},
        bytes(4),
        "[request id: r1] input byte size mismatch for input 'X' for model 'm'. Expected 3, got 4",
        id="size-mismatch-with-id",
    ),
    pytest.param(
        one_input(datatype="BYTES", shape=[1], parameters={"binary_data_size": 10}),
        b"\x01\x00\x00\x00a\x01\x00\x00\x00b",
        NO_ID + "unexpected number of string "
        "elements 2 for inference input 'X' for model 'm', expecting 1",
        id="bytes-too-many",
    ),
    pytest.param(
        one_input(datatype="BYTES", shape=[2], parameters={"binary_data_size": 5}),
        b"\x01\x00\x00\x00a",
        NO_ID + "expected 2 string elements for inference input 'X' for model 'm', got 1",
        id="bytes-too-few",
    ),
    pytest.param(
        one_input(datatype="BYTES", shape=[2], parameters={"binary_data_size": 7}),
        b"\x01\x00\x00\x00a\x01\x00",
        NO_ID + "incomplete string length indicator for "
        "inference input 'X' for model 'm', expecting 4 bytes but only 2 bytes "
        "available. Please make sure the string length indicator is in one buffer.",
        id="bytes-length-cut",
    ),
    pytest.param(
        one_input(datatype="BYTES", shape=[1], parameters={"binary_data_size": 6}),
        b"\x05\x00\x00\x00ab",
        NO_ID + "incomplete string data for inference input 'X' "
        "for model 'm', expecting 5 bytes but only 2 bytes available",
        id="bytes-data-cut",
    ),
    pytest.param(
        one_input(datatype="BYTES", shape=[0], parameters={"binary_data_size": 4}),
        bytes(4),
        NO_ID + "unexpected number of string elements 1 for inference input "
        "'X' for model 'm', expecting 0",
        id="bytes-zero-elements",
    ),
]


@pytest.mark.parametrize(("header", "binary", "message"), BINARY_ERRORS)
def test_binary_errors(header: dict[str, Any], binary: bytes, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        decode(header, binary)
    assert info.value.message == message


def test_binary_input_without_header_length() -> None:
    body, _ = build(one_input(datatype="FP32", shape=[1], parameters=BIN4))
    with pytest.raises(InvalidArgumentError) as info:
        decode_infer_request(body, header_length=None, model="m")
    assert info.value.message == (
        "must specify valid 'Infer-Header-Content-Length' in request header and "
        "'binary_data_size' when passing inputs in binary data format"
    )


@pytest.mark.parametrize(
    ("body", "header_length", "limit", "message"),
    [
        pytest.param(
            b'{"inputs":[]}',
            None,
            8,
            "request JSON size of 13 bytes exceeds the maximum "
            "allowed input size of 8 bytes. Use --http-max-input-size to increase the "
            "limit.",
            id="json-over-limit",
        ),
        pytest.param(
            b"123456789",
            0,
            8,
            "Raw input has a byte_size (9 bytes) that exceeds the "
            "maximum allowed value of 8 bytes. Use --http-max-input-size to increase the "
            "limit.",
            id="raw-over-limit",
        ),
        pytest.param(
            b'{"inputs":[]}',
            20,
            100,
            "unexpected size for request JSON, expecting 7 more bytes",
            id="header-past-body",
        ),
        pytest.param(
            b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1000000000],"data":[1]}]}',
            None,
            2**20,
            "JSON input 'X' has a byte_size (4000000000 bytes) that exceeds "
            "the maximum allowed value of 1048576 bytes. Use --http-max-input-size to "
            "increase the limit.",
            id="json-input-over-limit",
        ),
        pytest.param(
            b"{x",
            None,
            100,
            "failed to parse the request JSON buffer: ",  # the reason is orjson's wording
            id="bad-json",
        ),
        pytest.param(
            b"",
            None,
            100,
            "failed to parse the request JSON buffer: ",
            id="empty-body",
        ),
    ],
)
def test_size_and_framing_errors(
    body: bytes, header_length: int | None, limit: int, message: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        decode_infer_request(body, header_length=header_length, model="m", max_input_bytes=limit)
    if message.endswith(": "):
        # orjson's own reason text differs between its versions; ours is the prefix.
        assert info.value.message.startswith(message)
        assert len(info.value.message) > len(message)
    else:
        assert info.value.message == message


def test_json_bytes_over_limit_counts_length_prefixes() -> None:
    # 100 empty strings: about 300 bytes of JSON, but 400 bytes once length-prefixed.
    body, _ = build(one_input(datatype="BYTES", shape=[100], data=[""] * 100))
    with pytest.raises(InvalidArgumentError) as info:
        decode_infer_request(body, header_length=None, model="m", max_input_bytes=len(body))
    assert info.value.message == (
        f"JSON input 'X' has a byte_size (400 bytes) that exceeds the maximum allowed value of "
        f"{len(body)} bytes. Use --http-max-input-size to increase the limit."
    )


def test_non_object_json_has_no_inputs() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        decode_infer_request(b"[1]", header_length=None, model="m")
    assert info.value.message == (
        "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"
    )


# --- header length ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), ("0", 0), ("10", 10), (" 7 ", 7), ("+3", 3)]
)
def test_parse_header_length(value: str | None, expected: int | None) -> None:
    assert parse_header_length(value, content_length=10) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "Unable to parse Inference-Header-Content-Length, got: abc"),
        ("", "Unable to parse Inference-Header-Content-Length, got: "),
        ("1.5", "Unable to parse Inference-Header-Content-Length, got: 1.5"),
        (
            "99999999999",
            "Unable to parse Inference-Header-Content-Length, value is out of range "
            "[ -2147483648, 2147483647 ], got: 99999999999",
        ),
        ("11", "inference header size should be in range (0, 10), got: 11"),
        ("-1", "inference header size should be in range (0, 10), got: -1"),
    ],
)
def test_parse_header_length_errors(value: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        parse_header_length(value, content_length=10)
    assert info.value.message == message


# --- responses read by the real client -------------------------------------------------------


def expected_from_client(datatype: str, data: Any, *, binary: bool) -> Any:
    """What ``InferResult.as_numpy`` gives back for server-form ``data``."""
    if datatype == "BF16":
        return to_bf16(data)
    if datatype == "BYTES" and not binary:
        return np.array([e.decode() for e in data.ravel()], dtype=object).reshape(data.shape)
    return data


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_response_round_trips_through_client(datatype: str, binary: bool) -> None:
    data = sample(datatype, (2, 3), text=not binary)
    body, length = encode_infer_response(
        model_name="m",
        model_version="3",
        request_id="9",
        outputs=[OutputTensor("OUT", datatype, data, binary)],
    )
    assert (length is not None) == binary
    result = read(body, length)
    got = result.as_numpy("OUT")
    expected = expected_from_client(datatype, data, binary=binary)
    if datatype in ("FP16", "BF16", "FP32", "FP64"):
        np.testing.assert_array_equal(got.astype(np.float64), expected.astype(np.float64))
        assert got.dtype == expected.dtype
    else:
        assert_same(got, expected)
    output = result.get_output("OUT")
    assert (output["datatype"], output["shape"]) == (datatype, [2, 3])


def test_response_layout_and_field_order() -> None:
    outputs = [
        OutputTensor("A", "INT32", np.array([1, 2], dtype=np.int32), True),
        OutputTensor("B", "FP32", np.array([[0.5]], dtype=np.float32), False),
        OutputTensor("C", "UINT8", np.array([7], dtype=np.uint8), True),
    ]
    body, length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id="42",
        outputs=outputs,
        parameters={"p": "v"},
    )
    head = (
        b'{"id":"42","model_name":"m","model_version":"1","parameters":{"p":"v"},"outputs":['
        b'{"name":"A","datatype":"INT32","shape":[2],"parameters":{"binary_data_size":8}},'
        b'{"name":"B","datatype":"FP32","shape":[1,1],"data":[0.5]},'
        b'{"name":"C","datatype":"UINT8","shape":[1],"parameters":{"binary_data_size":1}}]}'
    )
    assert length == len(head)
    assert body == head + b"\x01\x00\x00\x00\x02\x00\x00\x00\x07"


def test_response_without_id_or_parameters() -> None:
    body, length = encode_infer_response(
        model_name="m",
        model_version="2",
        request_id=None,
        parameters={},
        outputs=[OutputTensor("A", "BOOL", np.array([True, False]), False)],
    )
    assert length is None
    assert body == (
        b'{"model_name":"m","model_version":"2","outputs":'
        b'[{"name":"A","datatype":"BOOL","shape":[2],"data":[true,false]}]}'
    )


def test_all_binary_outputs_empty_gives_plain_json() -> None:
    outputs = [OutputTensor("E", "FP32", np.zeros((0, 4), dtype=np.float32), True)]
    body, length = encode_infer_response(
        model_name="m", model_version="1", request_id=None, outputs=outputs
    )
    assert length is None
    assert orjson.loads(body)["outputs"][0]["parameters"] == {"binary_data_size": 0}
    assert read(body, None).as_numpy("E").shape == (0, 4)


def test_response_converts_data_to_the_declared_datatype() -> None:
    strided = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]  # not contiguous, not int32
    body, length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id=None,
        outputs=[
            OutputTensor("A", "INT32", strided, True),
            OutputTensor("B", "INT32", strided, False),
        ],
    )
    result = read(body, length)
    assert_same(result.as_numpy("A"), strided.astype(np.int32))
    assert_same(result.as_numpy("B"), strided.astype(np.int32))


def test_bytes_output_accepts_str_elements_and_string_arrays() -> None:
    mixed = np.array(["h\u00e9", b"x", 5], dtype=object)
    fixed = np.array([b"ab", b"c"])  # numpy 'S' dtype
    body, length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id=None,
        outputs=[OutputTensor("M", "BYTES", mixed, True), OutputTensor("F", "BYTES", fixed, False)],
    )
    result = read(body, length)
    assert result.as_numpy("M").tolist() == ["h\u00e9".encode(), b"x", b"5"]
    assert result.as_numpy("F").tolist() == ["ab", "c"]


def test_non_utf8_bytes_asked_as_json_go_binary() -> None:
    data = np.array([b"ok", b"\xff\xfe"], dtype=object)
    body, length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id=None,
        outputs=[OutputTensor("S", "BYTES", data, False)],
    )
    assert length is not None
    assert read(body, length).as_numpy("S").tolist() == [b"ok", b"\xff\xfe"]


def test_json_nan_and_inf_become_null() -> None:
    data = np.array([np.nan, np.inf, 1.0], dtype=np.float32)
    body, length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id=None,
        outputs=[OutputTensor("F", "FP32", data, False)],
    )
    assert orjson.loads(body)["outputs"][0]["data"] == [None, None, 1.0]
    got = read(body, length).as_numpy("F")
    assert np.isnan(got[0]) and got[2] == 1.0


def test_bf16_rounds_to_nearest_even_like_ml_dtypes() -> None:
    specials = np.array(
        [
            0.0,
            -0.0,
            1.0,
            1.00390625,
            1.01171875,
            1.0 + 2**-8 + 2**-20,
            3.4e38,
            -3.4e38,
            1e-40,
            np.inf,
            -np.inf,
            np.nan,
        ],
        dtype=np.float32,
    )
    odd_nans = np.array([0x7F800001, 0xFFFFFFFF, 0x7FFFFFFF], dtype=np.uint32).view(np.float32)
    noise = np.random.default_rng(1).standard_normal(4096).astype(np.float32) * 1e3
    values = np.concatenate([specials, odd_nans, noise])
    body, length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id=None,
        outputs=[OutputTensor("H", "BF16", values, True)],
    )
    got = read(body, length).as_numpy("H")
    expected = to_bf16(values)
    finite = ~np.isnan(values)
    assert got[finite].view(np.uint16).tolist() == expected[finite].view(np.uint16).tolist()
    assert np.isnan(got[~finite].astype(np.float32)).all()


# --- property tests --------------------------------------------------------------------------

FLOAT_WIDTHS: dict[str, Literal[16, 32, 64]] = {"FP16": 16, "FP32": 32, "FP64": 64}
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def numeric_tensors(draw: st.DrawFn, *, json_safe: bool = False) -> tuple[str, Any]:
    datatype = draw(st.sampled_from([t for t in NUMERIC_TYPES if t != "BF16"]))
    dtype = np.dtype(NUMPY[datatype])
    elements = None
    if dtype.kind == "f":
        elements = st.floats(
            width=FLOAT_WIDTHS[datatype], allow_nan=not json_safe, allow_infinity=not json_safe
        )
    return datatype, draw(hnp.arrays(dtype, SHAPES, elements=elements))


bytes_tensors = hnp.arrays(object, SHAPES, elements=st.binary(max_size=12))
text_tensors = hnp.arrays(object, SHAPES, elements=st.text(max_size=6).map(str.encode))


@PROPERTY
@given(tensor=numeric_tensors())
def test_property_binary_request_round_trip(tensor: tuple[str, Any]) -> None:
    datatype, data = tensor
    body, length = client_request([client_input("X", datatype, data, binary=True)])
    assert_same(decode_infer_request(body, header_length=length, model="m").inputs[0].data, data)


@PROPERTY
@given(tensor=numeric_tensors(json_safe=True))
def test_property_json_request_round_trip(tensor: tuple[str, Any]) -> None:
    datatype, data = tensor
    if datatype == "FP16":
        datatype, data = "FP32", data.astype(np.float32)
    body, _ = client_request([client_input("X", datatype, data, binary=False)])
    got = decode_infer_request(body, header_length=None, model="m").inputs[0].data
    assert got.shape == data.shape and got.dtype == data.dtype
    np.testing.assert_array_equal(got, data)


@PROPERTY
@given(tensor=numeric_tensors(), binary=st.booleans())
def test_property_response_round_trip(tensor: tuple[str, Any], binary: bool) -> None:
    datatype, data = tensor
    body, length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id=None,
        outputs=[OutputTensor("Y", datatype, data, binary)],
    )
    got = read(body, length).as_numpy("Y")
    assert got.shape == data.shape and got.dtype == data.dtype
    if binary:
        assert got.tobytes() == data.tobytes()
    else:  # JSON has no NaN or infinity: they come back as NaN
        finite = np.isfinite(data) if data.dtype.kind == "f" else np.ones(data.shape, dtype=bool)
        np.testing.assert_array_equal(got[finite], data[finite])


@PROPERTY
@given(data=bytes_tensors)
def test_property_bytes_binary_round_trip(data: Any) -> None:
    body, length = client_request([client_input("S", "BYTES", data, binary=True)])
    assert_same(decode_infer_request(body, header_length=length, model="m").inputs[0].data, data)
    body, length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id=None,
        outputs=[OutputTensor("S", "BYTES", data, True)],
    )
    result = read(body, length)
    got = result.as_numpy("S")
    # tritonclient decodes a zero-byte buffer as an empty array of its own dtype
    assert got.shape == data.shape and got.ravel().tolist() == data.ravel().tolist()


@PROPERTY
@given(data=text_tensors)
def test_property_bytes_json_round_trip(data: Any) -> None:
    body, _ = client_request([client_input("S", "BYTES", data, binary=False)])
    assert_same(decode_infer_request(body, header_length=None, model="m").inputs[0].data, data)
    body, length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id=None,
        outputs=[OutputTensor("S", "BYTES", data, False)],
    )
    got = read(body, length).as_numpy("S")
    assert got.shape == data.shape
    assert got.ravel().tolist() == [e.decode() for e in data.ravel()]


# --- classification --------------------------------------------------------------------------


def test_classify_top_k_with_labels() -> None:
    scores = np.array([0.1, 0.7, 0.2, 0.05], dtype=np.float32)
    result = classify(scores, 3, batching=False, labels=["cat", "dog", "", "cow"])
    assert result.dtype == object
    assert result.tolist() == [b"0.700000:1:dog", b"0.200000:2", b"0.100000:0:cat"]


def test_classify_batching_classifies_each_entry() -> None:
    scores = np.array([[[1, 5]], [[9, 2]]], dtype=np.int32)  # batch 2, 2 elements each
    result = classify(scores, 5, batching=True, labels=None)
    assert result.shape == (2, 2)
    assert result.tolist() == [[b"5:1", b"1:0"], [b"9:0", b"2:1"]]


def test_classify_without_batching_flattens() -> None:
    scores = np.array([[1, 5], [9, 2]], dtype=np.uint8)
    assert classify(scores, 2, batching=False, labels=None).tolist() == [b"9:2", b"5:1"]


def test_classify_batch_of_zero_uses_the_flat_shape() -> None:
    assert classify(np.zeros((0, 3), dtype=np.float64), 2, batching=True, labels=None).shape == (0,)


def test_classify_ties_keep_the_lower_index_first() -> None:
    scores = np.array([2, 3, 3, 1, 3], dtype=np.int64)
    assert classify(scores, 4, batching=False, labels=["a"]).tolist() == [
        b"3:1",
        b"3:2",
        b"3:4",
        b"2:0:a",
    ]


def test_classification_goes_out_as_bytes_the_client_reads() -> None:
    cls = classify(np.array([[0.25, 0.75]], dtype=np.float32), 1, batching=True, labels=None)
    body, length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id=None,
        outputs=[OutputTensor("C", "BYTES", cls, True), OutputTensor("J", "BYTES", cls, False)],
    )
    result = read(body, length)
    assert result.as_numpy("C").tolist() == [[b"0.750000:1"]]
    assert result.as_numpy("J").tolist() == [["0.750000:1"]]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            np.zeros(2, dtype=np.float16),
            "class result not available for output due to unsupported type 'FP16'",
        ),
        (
            np.zeros(2, dtype=np.bool_),
            "class result not available for output due to unsupported type 'BOOL'",
        ),
        (
            np.array([b"a"], dtype=object),
            "class result not available for output due to unsupported type 'BYTES'",
        ),
        (np.zeros(1_000_001, dtype=np.uint8), "classification output tensor too large"),
    ],
)
def test_classify_errors(data: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        classify(data, 1, batching=False, labels=None)
    assert info.value.message == message


def test_public_surface() -> None:
    assert sorted(protocol.__all__, key=str.lower) == [
        "bind_raw_input",
        "classify",
        "decode_infer_request",
        "DEFAULT_MAX_INPUT_BYTES",
        "encode_infer_response",
        "InferInput",
        "InferRequest",
        "OutputTensor",
        "parse_header_length",
        "RAW_INPUT_NAME",
        "REGION_PARAMETER",
        "RequestedOutput",
        "shared_memory_ref",
        "SharedMemoryRef",
    ]
