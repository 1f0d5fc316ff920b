"""What a broken or hostile client gets from the gRPC listener: malformed protobuf, messages
over the size limit, unknown methods, streams cut short. Each gets a clear status, nothing
hangs, and the server goes on serving."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from foundation.proto import grpc_service_pb2 as pb
from tests.data_plane.grpc.serving import GrpcServing, limits_under_test, serving
from tests.models import write_onnx_add_sub

CALL_TIMEOUT_S = 60.0
MAX_RECEIVE_BYTES = 64 * 1024
SERVICE = "/inference.GRPCInferenceService/"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServing]:
    repo = tmp_path_factory.mktemp("repo")
    write_onnx_add_sub(repo, "add_sub", dtype="FP32", dims=(-1,), max_batch_size=8)
    settings = limits_under_test(
        grpc_max_receive_bytes=MAX_RECEIVE_BYTES, grpc_stream_max_in_flight=2
    )
    with serving(repo, tmp_path_factory.mktemp("cache"), settings, load_models=("*",)) as running:
        yield running


@pytest.fixture
def channel(server: GrpcServing) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as opened:
        yield opened


def raw_call(channel: grpc.Channel, method: str, payload: bytes) -> bytes:
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(SERVICE + method)
    return call(payload, timeout=CALL_TIMEOUT_S)


def add_sub_request(width: int, request_id: str = "", model: str = "add_sub") -> bytes:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, width])
        request.raw_input_contents.append(np.ones(width, dtype=np.float32).tobytes())
    return request.SerializeToString()


def assert_serving(channel: grpc.Channel) -> None:
    answer = pb.ModelInferResponse.FromString(raw_call(channel, "ModelInfer", add_sub_request(4)))
    assert np.frombuffer(answer.raw_output_contents[0], dtype=np.float32).tolist() == [2.0] * 4


@pytest.mark.parametrize("method", ["ModelInfer", "ModelMetadata", "RepositoryModelLoad"])
def test_malformed_protobuf_gets_tritons_answer(channel: grpc.Channel, method: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        raw_call(channel, method, b"\xff\xff\xff\xff")
    assert raised.value.code() == grpc.StatusCode.INTERNAL
    assert raised.value.details() == "Unable to parse request"
    assert_serving(channel)


def test_oversized_message_is_refused(channel: grpc.Channel) -> None:
    width = MAX_RECEIVE_BYTES // 4  # two inputs of this many FP32: twice the limit
    with pytest.raises(grpc.RpcError) as raised:
        raw_call(channel, "ModelInfer", add_sub_request(width))
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in (raised.value.details() or "")
    assert_serving(channel)


def test_unknown_method_is_unimplemented(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        raw_call(channel, "NoSuchMethod", b"")
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert_serving(channel)


def test_stream_answers_what_came_before_a_malformed_message(channel: grpc.Channel) -> None:
    stream: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
        SERVICE + "ModelStreamInfer"
    )
    sent = [add_sub_request(4, "a"), add_sub_request(4, "b"), b"\xff\xff", add_sub_request(4, "c")]
    answered = []
    with pytest.raises(grpc.RpcError) as raised:
        for data in stream(iter(sent), timeout=CALL_TIMEOUT_S):
            answered.append(pb.ModelStreamInferResponse.FromString(data).infer_response.id)
    assert raised.value.code() == grpc.StatusCode.INTERNAL
    assert raised.value.details() == "Unable to parse request"
    assert sorted(answered) == ["a", "b"]
    assert_serving(channel)


def test_stream_longer_than_its_in_flight_bound(channel: grpc.Channel) -> None:
    stream: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
        SERVICE + "ModelStreamInfer"
    )
    sent = [add_sub_request(4, str(i), "add_sub" if i % 5 else "missing") for i in range(40)]
    answers = [pb.ModelStreamInferResponse.FromString(d) for d in stream(iter(sent))]
    assert sorted(int(a.infer_response.id) for a in answers) == list(range(40))
    failed = {int(a.infer_response.id) for a in answers if a.error_message}
    assert failed == set(range(0, 40, 5))


def test_stream_cancelled_by_the_client(channel: grpc.Channel) -> None:
    stream: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
        SERVICE + "ModelStreamInfer"
    )

    def requests() -> Iterator[bytes]:
        yield add_sub_request(4, "first")
        yield add_sub_request(4, "second")

    call = stream(requests(), timeout=CALL_TIMEOUT_S)
    first = pb.ModelStreamInferResponse.FromString(next(call))
    assert first.infer_response.id in ("first", "second")
    call.cancel()
    assert_serving(channel)


def test_unsupported_parameter_types_are_refused(channel: grpc.Channel) -> None:
    request = pb.ModelInferRequest.FromString(add_sub_request(4))
    request.parameters["custom"].uint64_param = 1
    with pytest.raises(grpc.RpcError) as raised:
        raw_call(channel, "ModelInfer", request.SerializeToString())
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == (
        "invalid value type for 'custom' parameter, expected int64_param, bool_param, or "
        "string_param."
    )
    assert_serving(channel)
