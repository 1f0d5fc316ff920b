"""Sequence models over gRPC, with ``tritonclient.grpc`` unchanged against the data plane's
listener in process: ``sequence_id`` as a number or a string with ``sequence_start`` and
``sequence_end`` on ModelInfer, sequences pipelined on one ModelStreamInfer stream (sent
without waiting for answers: the stream keeps their order), and Triton's errors."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from foundation.proto import grpc_service_pb2 as pb  # noqa: E402
from tests.data_plane.grpc.serving import GrpcServing, serving  # noqa: E402
from tests.data_plane.sequence.models import (  # noqa: E402
    write_onnx_accumulator,
    write_python_accumulator,
)

STREAM_TIMEOUT_S = 60.0
MODELS = ("onnx_direct", "onnx_oldest", "py_direct")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServing]:
    repo = tmp_path_factory.mktemp("repo")
    write_onnx_accumulator(repo, "onnx_direct")
    write_onnx_accumulator(repo, "onnx_oldest", strategy="oldest { max_candidate_sequences: 3 }")
    write_python_accumulator(repo, "py_direct")
    with serving(repo, tmp_path_factory.mktemp("cache"), load_models=MODELS) as running:
        yield running


@pytest.fixture
def client(server: GrpcServing) -> Iterator[Any]:
    c = grpcclient.InferenceServerClient(server.address)
    try:
        yield c
    finally:
        c.close()


def inputs(value: int) -> list[Any]:
    tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return [tensor]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("correlation_id", [9, "nine"])
def test_a_sequence_over_model_infer(client: Any, model: str, correlation_id: int | str) -> None:
    sums = []
    for index, value in enumerate([4, 5, 6]):
        result = client.infer(
            model,
            inputs(value),
            sequence_id=correlation_id,
            sequence_start=index == 0,
            sequence_end=index == 2,
        )
        sums.append(int(result.as_numpy("OUTPUT")[0][0]))
    assert sums == [4, 9, 15]


@pytest.mark.parametrize("model", MODELS)
def test_sequences_pipelined_on_one_stream(client: Any, model: str) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    steps = 6
    ids = [101, 102, "s103", 104, 105]  # more than the slots: some wait in the backlog
    try:
        for step in range(steps):
            for cid in ids:
                client.async_stream_infer(
                    model,
                    inputs(1),
                    request_id=f"{cid}/{step}",
                    sequence_id=cid,
                    sequence_start=step == 0,
                    sequence_end=step == steps - 1,
                )
        sums: dict[str, int] = {}
        for _ in range(steps * len(ids)):
            result, error = answers.get(timeout=STREAM_TIMEOUT_S)
            assert error is None, error
            sums[result.get_response().id] = int(result.as_numpy("OUTPUT")[0][0])
    finally:
        client.stop_stream()
    assert sums == {f"{cid}/{step}": step + 1 for cid in ids for step in range(steps)}


def test_tritons_errors_over_grpc(client: Any) -> None:
    with pytest.raises(InferenceServerException) as missing:
        client.infer("onnx_direct", inputs(1))
    assert missing.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert missing.value.message() == (
        "inference request to model 'onnx_direct' must specify a non-zero or non-empty "
        "correlation ID"
    )
    with pytest.raises(InferenceServerException) as not_started:
        client.infer("onnx_direct", inputs(1), sequence_id=31)
    assert not_started.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert not_started.value.message() == (
        "inference request for sequence 31 to model 'onnx_direct' must specify the START flag "
        "on the first request of the sequence"
    )


def test_a_negative_int64_id_is_its_uint64(server: GrpcServing) -> None:
    """gRPC carries ``sequence_id`` as int64: Triton reads its bits as a uint64."""

    def infer(**flags: bool) -> pb.ModelInferResponse:
        request = pb.ModelInferRequest(model_name="onnx_direct")
        request.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
        request.raw_input_contents.append(np.array([[2]], dtype=np.int32).tobytes())
        request.parameters["sequence_id"].int64_param = -5
        for key, value in flags.items():
            request.parameters[key].bool_param = value
        with grpc.insecure_channel(server.address) as channel:
            call = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            response: pb.ModelInferResponse = call(request, timeout=STREAM_TIMEOUT_S)
            return response

    first = infer(sequence_start=True)
    names = [o.name for o in first.outputs]
    corrid = np.frombuffer(first.raw_output_contents[names.index("CORRID_OUT")], dtype=np.uint64)
    assert corrid.tolist() == [2**64 - 5]
    last = infer(sequence_end=True)
    total = np.frombuffer(last.raw_output_contents[names.index("OUTPUT")], dtype=np.int32)
    assert total.tolist() == [4]
