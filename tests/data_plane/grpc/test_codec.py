"""The gRPC codec alone: ModelInferRequest messages (typed contents and raw contents, every
datatype) to the handlers' InferRequest, responses back, and Triton's texts for what it
refuses."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from data_plane.errors import InvalidArgumentError
from data_plane.grpc.codec import (
    UnparsableMessageError,
    decode_infer_request,
    encode_infer_response,
    model_version,
    parse,
)
from data_plane.handlers.infer import InferResponse
from data_plane.protocol import OutputTensor, SharedMemoryRef
from foundation.proto import grpc_service_pb2 as pb

Tensor = pb.ModelInferRequest.InferInputTensor


def request_with(tensor: Tensor, raw: list[bytes] | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", inputs=[tensor])
    request.raw_input_contents.extend(raw or [])
    return request


def refused(request: pb.ModelInferRequest) -> str:
    with pytest.raises(InvalidArgumentError) as raised:
        decode_infer_request(request, "m")
    return raised.value.message


@pytest.mark.parametrize(
    ("text", "version"),
    [("", None), ("1", 1), ("12", 12), (" 3", 3), ("+4", 4), ("2x", 2), ("0", 0)],
)
def test_model_version_reads_as_stol(text: str, version: int | None) -> None:
    assert model_version(text) == version


def test_model_version_refusals() -> None:
    for text in ("x", "-", "99999999999999999999"):
        with pytest.raises(InvalidArgumentError) as raised:
            model_version(text)
        assert raised.value.message == (
            f"failed to get model version from specified version string '{text}' (details: "
            "stol), version should be an integral value > 0"
        )
    with pytest.raises(InvalidArgumentError) as raised:
        model_version("-1")
    assert raised.value.message == (
        "invalid model version specified '-1' , version should be an integral value > 0"
    )


TYPED = [
    ("BOOL", "bool_contents", [True, False, True], np.array([True, False, True])),
    ("INT8", "int_contents", [1, 300, -2], np.array([1, 44, -2], dtype=np.int8)),
    ("INT16", "int_contents", [1, 70000, -2], np.array([1, 4464, -2], dtype=np.int16)),
    ("INT32", "int_contents", [1, -2, 3], np.array([1, -2, 3], dtype=np.int32)),
    ("INT64", "int64_contents", [2**40, -1, 0], np.array([2**40, -1, 0], dtype=np.int64)),
    ("UINT8", "uint_contents", [1, 257, 3], np.array([1, 1, 3], dtype=np.uint8)),
    ("UINT16", "uint_contents", [1, 70000, 3], np.array([1, 4464, 3], dtype=np.uint16)),
    ("UINT32", "uint_contents", [1, 2**32 - 1, 3], np.array([1, 2**32 - 1, 3], dtype=np.uint32)),
    ("UINT64", "uint64_contents", [2**63, 1, 0], np.array([2**63, 1, 0], dtype=np.uint64)),
    ("FP32", "fp32_contents", [1.5, -2.0, 0.25], np.array([1.5, -2.0, 0.25], dtype=np.float32)),
    ("FP64", "fp64_contents", [1e300, -2.0, 0.5], np.array([1e300, -2.0, 0.5])),
]


@pytest.mark.parametrize(("datatype", "field", "values", "expected"), TYPED)
def test_typed_contents(datatype: str, field: str, values: list[object], expected) -> None:
    tensor = Tensor(name="x", datatype=datatype, shape=[1, 3])
    getattr(tensor.contents, field).extend(values)
    decoded = decode_infer_request(request_with(tensor), "m").inputs[0]
    assert (decoded.name, decoded.datatype, decoded.shape) == ("x", datatype, (1, 3))
    np.testing.assert_array_equal(decoded.data, expected.reshape(1, 3))
    assert decoded.data.dtype == expected.dtype


def test_typed_bytes() -> None:
    tensor = Tensor(name="x", datatype="BYTES", shape=[2])
    tensor.contents.bytes_contents.extend([b"a", b"\xff\x00"])
    decoded = decode_infer_request(request_with(tensor), "m").inputs[0]
    assert decoded.data.tolist() == [b"a", b"\xff\x00"]
    tensor.contents.bytes_contents.append(b"extra")
    assert refused(request_with(tensor)) == (
        "[request id: <id_unknown>] unexpected number of string elements 3 for inference "
        "input 'x' for model 'm', expecting 2"
    )


@pytest.mark.parametrize(
    ("datatype", "array"),
    [
        ("FP16", np.array([1.5, -2.0], dtype="<f2")),
        ("BF16", np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)),
        ("UINT64", np.array([2**64 - 1, 0], dtype="<u8")),
        ("BOOL", np.array([True, False])),
    ],
)
def test_raw_contents(datatype: str, array: np.ndarray) -> None:
    tensor = Tensor(name="x", datatype=datatype, shape=[2])
    decoded = decode_infer_request(request_with(tensor, [array.tobytes()]), "m").inputs[0]
    np.testing.assert_array_equal(decoded.data.astype(np.float64), array.astype(np.float64))


def test_raw_contents_go_to_the_inputs_without_contents_in_order() -> None:
    first = Tensor(name="a", datatype="INT32", shape=[1])
    second = Tensor(name="b", datatype="INT32", shape=[2])
    raw = [np.array([7], np.int32).tobytes(), np.array([8, 9], np.int32).tobytes(), b"left"]
    request = pb.ModelInferRequest(model_name="m", inputs=[first, second])
    request.raw_input_contents.extend(raw)
    decoded = decode_infer_request(request, "m").inputs
    assert [d.data.tolist() for d in decoded] == [[7], [8, 9]]
    request.ClearField("raw_input_contents")
    request.raw_input_contents.append(raw[0])
    assert refused(request) == "unable to find data for input tensor 'b' for model 'm' in request."


def test_typed_contents_refusals() -> None:
    tensor = Tensor(name="x", datatype="FP16", shape=[1])
    tensor.contents.fp32_contents.append(1.0)
    assert refused(request_with(tensor)) == (
        "unexpected explicit tensor data for input tensor 'x' for model 'm' of type 'FP32', "
        "expected datatype 'FP16'"
    )
    tensor.datatype = "NOPE"
    assert refused(request_with(tensor)).endswith("expected datatype '<invalid>'")
    tensor = Tensor(name="x", datatype="INT8", shape=[1])
    tensor.contents.int_contents.append(1)
    tensor.contents.int64_contents.append(1)
    assert refused(request_with(tensor)) == (
        "unexpected explicit tensor data for input tensor 'x' for model 'm', binary data was "
        "already supplied."
    )
    tensor = Tensor(name="x", datatype="FP32", shape=[2])
    tensor.contents.fp32_contents.append(1.0)
    assert refused(request_with(tensor, [b"\0\0\0\0"])) == (
        "contents field must not be specified when using raw_input_contents for 'x' for model 'm'"
    )
    assert refused(request_with(tensor)) == (
        "[request id: <id_unknown>] input byte size mismatch for input 'x' for model 'm'. "
        "Expected 8, got 4"
    )
    tensor = Tensor(name="x", datatype="FP32", shape=[2])
    tensor.contents.SetInParent()  # present but empty: no data, as in Triton
    assert refused(request_with(tensor)).endswith("Expected 8, got 0")


def test_shape_refusals() -> None:
    negative = Tensor(name="x", datatype="FP32", shape=[1, -2])
    assert "negative" in refused(request_with(negative, [b""]))
    huge = Tensor(name="x", datatype="FP32", shape=[0, 2**62, 2**62])
    assert "too large to hold" in refused(request_with(huge, [b""]))
    unknown = Tensor(name="x", datatype="FP8", shape=[1])
    assert refused(request_with(unknown, [b"\0"])) == (
        "invalid datatype for input x: 'FP8' is not a protocol datatype"
    )
    twice = pb.ModelInferRequest(model_name="m", inputs=[Tensor(name="x"), Tensor(name="x")])
    assert refused(twice) == "[request id: <id_unknown>] input 'x' already exists in request"


def test_parameters() -> None:
    tensor = Tensor(name="x", datatype="INT32", shape=[1])
    tensor.contents.int_contents.append(1)
    request = request_with(tensor)
    request.id = "r"
    request.parameters["priority"].uint64_param = 2
    request.parameters["timeout"].int64_param = 500
    request.parameters["sequence_id"].string_param = "seq"
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    request.parameters["custom"].double_param = 0.5
    decoded = decode_infer_request(request, "m")
    assert (decoded.id, decoded.priority, decoded.timeout_us) == ("r", 2, 500)
    assert decoded.parameters["custom"] == 0.5
    assert decoded.parameters["sequence_id"] == "seq"
    cases = [
        ("priority", "string_param", "x", "expected int64_param or uint64_param."),
        ("timeout", "bool_param", True, "expected int64_param."),
        ("sequence_start", "int64_param", 1, "expected bool_param."),
        ("custom", "uint64_param", 1, "expected int64_param, bool_param, or string_param."),
    ]
    for key, choice, value, expected in cases:
        bad = request_with(tensor)
        setattr(bad.parameters[key], choice, value)
        assert refused(bad) == f"invalid value type for '{key}' parameter, {expected}"
    bad = request_with(tensor)
    bad.parameters["priority"].int64_param = -1
    assert refused(bad) == "invalid value for 'priority', expected value >= 0."
    bad = request_with(tensor)
    bad.parameters["triton_other"].bool_param = True
    assert refused(bad).startswith("parameter keys starting with 'triton_' are reserved")


def test_requested_outputs() -> None:
    tensor = Tensor(name="x", datatype="INT32", shape=[1])
    tensor.contents.int_contents.append(1)
    request = request_with(tensor)
    request.outputs.add(name="a").parameters["classification"].int64_param = 2
    request.outputs.add(name="b")
    request.outputs.add(name="a")
    outputs = decode_infer_request(request, "m").outputs
    assert outputs is not None
    assert [(o.name, o.classification) for o in outputs] == [("a", 2), ("b", 0)]
    request.outputs[1].parameters["classification"].int64_param = 0
    assert refused(request) == "invalid value for 'classification' parameter, expected >= 0"
    request.outputs[1].parameters["classification"].string_param = "2"
    assert refused(request) == (
        "invalid value type for 'classification' parameter, expected int64_param"
    )


def test_shared_memory_places() -> None:
    tensor = Tensor(name="x", datatype="INT32", shape=[1])
    tensor.parameters["shared_memory_region"].string_param = "r"
    assert refused(request_with(tensor)) == (
        "'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
        "parameter for tensor 'x'"
    )
    tensor.parameters["shared_memory_byte_size"].int64_param = 4
    tensor.parameters["shared_memory_offset"].int64_param = -1
    decoded = decode_infer_request(request_with(tensor), "m")
    assert decoded.uses_shared_memory
    # Unsigned, as Triton takes it: the region's bounds refuse it later.
    assert decoded.inputs[0].shared_memory == SharedMemoryRef("r", 2**64 - 1, 4)
    assert decoded.inputs[0].data.size == 0
    tensor.parameters["shared_memory_byte_size"].string_param = "4"
    assert refused(request_with(tensor)) == (
        "invalid value type for 'shared_memory_byte_size' parameter for tensor 'x', expected "
        "int64_param."
    )
    lone = Tensor(name="x", datatype="INT32", shape=[1])
    lone.parameters["shared_memory_offset"].int64_param = 0
    assert refused(request_with(lone, [b"\0\0\0\0"])) == (
        "'shared_memory_offset' can not be specified without 'shared_memory_region' "
        "parameter for tensor 'x'"
    )


def test_encode_response() -> None:
    response = InferResponse(
        model_name="m",
        model_version="1",
        id="r",
        outputs=[
            OutputTensor("f", "FP32", np.array([[1.5, 2.0]], dtype=np.float32), binary=False),
            OutputTensor("b", "BF16", np.array([1.0, 3.0], dtype=np.float32), binary=True),
            OutputTensor("s", "BYTES", np.array([b"ab", "é"], dtype=object), binary=False),
        ],
    )
    message = encode_infer_response(response)
    assert (message.model_name, message.model_version, message.id) == ("m", "1", "r")
    assert [(o.name, o.datatype, list(o.shape)) for o in message.outputs] == [
        ("f", "FP32", [1, 2]),
        ("b", "BF16", [2]),
        ("s", "BYTES", [2]),
    ]
    f, b, s = message.raw_output_contents
    assert np.frombuffer(f, "<f4").tolist() == [1.5, 2.0]
    assert np.frombuffer(b, ml_dtypes.bfloat16).astype(np.float32).tolist() == [1.0, 3.0]
    assert s == b"\x02\x00\x00\x00ab\x02\x00\x00\x00" + "é".encode()


def test_parse() -> None:
    assert parse(pb.ServerLiveRequest, b"").ByteSize() == 0
    with pytest.raises(UnparsableMessageError) as raised:
        parse(pb.ModelInferRequest, b"\xff\xff\xff")
    assert raised.value.message == "Unable to parse request"
