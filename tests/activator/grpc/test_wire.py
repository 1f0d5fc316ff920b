"""Reading routing fields from serialized messages: the same values protobuf reads, and a
clear error for bytes that are not a message."""

from __future__ import annotations

import pytest

from activator.grpc.wire import MalformedMessageError, string_fields, submessage_string
from foundation.proto import grpc_service_pb2 as pb


def _infer_request(**fields: object) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(**fields)  # type: ignore[arg-type]
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    tensor.parameters["p"].int64_param = 300  # a varint inside a nested message
    request.parameters["priority"].uint64_param = 2**40
    request.outputs.add(name="OUTPUT0")
    request.raw_input_contents.append(b"\x80" * 300)  # a two-byte length
    return request


@pytest.mark.parametrize(
    "request_message",
    [
        pytest.param(_infer_request(model_name="mlp", id="7"), id="infer"),
        pytest.param(_infer_request(model_name="", id=""), id="empty"),
        pytest.param(_infer_request(model_name="é" * 200, id="x" * 1000), id="long-utf8"),
        pytest.param(pb.ModelMetadataRequest(name="mlp", version="3"), id="metadata"),
        pytest.param(pb.ModelStatisticsRequest(name="mlp"), id="statistics"),
    ],
)
def test_the_fields_read_are_protobufs(request_message: pb.ModelInferRequest) -> None:
    data = request_message.SerializeToString()
    fields = string_fields(data, (1, 3))
    parsed = type(request_message).FromString(data)
    assert fields.get(1, "") == getattr(parsed, "model_name", getattr(parsed, "name", None))
    if isinstance(parsed, pb.ModelInferRequest):
        assert fields.get(3, "") == parsed.id


def test_the_last_occurrence_of_a_field_wins_as_in_protobuf() -> None:
    data = (
        pb.ModelInferRequest(model_name="first").SerializeToString()
        + _infer_request().SerializeToString()
        + pb.ModelInferRequest(model_name="last").SerializeToString()
    )
    assert string_fields(data, (1,)) == {1: "last"}
    assert pb.ModelInferRequest.FromString(data).model_name == "last"


def test_a_large_tensor_is_skipped_not_read() -> None:
    request = pb.ModelInferRequest(model_name="big")
    request.raw_input_contents.append(bytes(8 * 2**20))
    assert string_fields(memoryview(request.SerializeToString()), (1,)) == {1: "big"}


def test_a_responses_id_is_read_from_its_nested_message() -> None:
    response = pb.ModelStreamInferResponse(
        infer_response=pb.ModelInferResponse(model_name="m", id="r-9")
    )
    response.infer_response.raw_output_contents.append(bytes(1000))
    assert submessage_string(response.SerializeToString(), 2, 3) == "r-9"
    assert submessage_string(pb.ModelStreamInferResponse().SerializeToString(), 2, 3) == ""


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x0a\x05ab", id="length-past-end"),
        pytest.param(b"\x0a", id="length-missing"),
        pytest.param(b"\x0a\x02\xff\xfe", id="not-utf8"),
        pytest.param(b"\x0b", id="group-wire-type"),
        pytest.param(b"\x0e", id="unknown-wire-type"),
        pytest.param(b"\x02\x00", id="field-zero"),
        pytest.param(b"\x08" + b"\xff" * 11, id="varint-too-long"),
        pytest.param(b"\x08\x80", id="varint-truncated"),
        pytest.param(b"\x11\x00\x00", id="fixed64-truncated"),
        pytest.param(b"\x15\x00", id="fixed32-truncated"),
        pytest.param(b"\x0a\x80", id="length-varint-truncated"),
    ],
)
def test_bytes_that_are_no_message_are_refused(data: bytes) -> None:
    with pytest.raises(MalformedMessageError):
        string_fields(data, (1,))


def test_multi_byte_tags_and_fixed_fields_are_skipped() -> None:
    # Field 1000 (a two-byte tag) as a varint, a fixed64 and a fixed32 before the name.
    data = b"\xc0\x3e\x01" + b"\x11" + bytes(8) + b"\x1d" + bytes(4) + b"\x0a\x01m"
    assert string_fields(data, (1,)) == {1: "m"}
