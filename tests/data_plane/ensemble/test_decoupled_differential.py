"""Ensembles with decoupled steps on real Triton 2.51 and on ``zeroserve serve`` (a real
process), with the same repository (:mod:`tests.data_plane.ensemble.decoupled_repository`):
the same requests to both give the same statuses, responses and errors over HTTP
(``generate_stream``, ``generate``, and ``infer`` refused) and gRPC (``ModelStreamInfer``
message by message, unary ``ModelInfer`` refused), and the same refusal of an ensemble
mixing decoupled and plain branches. Skips, saying why, where Triton cannot run here.

Known differences, not compared:

- Triton adds ``sequence_id``, ``sequence_start`` and ``sequence_end`` to an ensemble's
  responses where a Python-backend step wrote an output (as for unary ensembles);
  zeroserve's carry none. They are taken out of Triton's answers.
- Whether the final flag rides on the last response or follows it as a bare flag depends,
  on both servers, on which ends first: the decoupled step's final flag or the last
  response's run through the steps after it. The gRPC messages are compared with a bare
  final flag folded into the response before it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from foundation.proto import grpc_service_pb2 as pb
from tests.data_plane.ensemble.decoupled_repository import ENSEMBLES, write_repository
from tests.triton_oracle import ServerPair, explicit_pair

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0
SEQUENCE_KEYS = ("sequence_id", "sequence_start", "sequence_end")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPair]:
    repo = write_repository(tmp_path_factory.mktemp("repo"))
    # After a step failed midway, Triton's repeat_int32 never finishes its finalize
    # (its sender thread died on the dropped request): without a short exit timeout
    # Triton waits 30 s for it.
    with explicit_pair(repo, tmp_path_factory, list(ENSEMBLES), "--exit-timeout-secs=2") as pair:
        yield pair


def _without_sequence(text: str) -> str:
    """A JSON object's text without Triton's sequence keys (other text as it is)."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return text
    if not isinstance(body, dict):
        return text
    return json.dumps({k: v for k, v in body.items() if k not in SEQUENCE_KEYS})


def _post(base: str, path: str, body: dict[str, Any]) -> tuple[int, list[str]]:
    """Status and the answer: each event's data for a stream, else the body."""
    response = httpx.post(f"{base}/v2/models/{path}", json=body, timeout=TIMEOUT_S)
    if response.text.startswith("data: "):
        parts = [line.removeprefix("data: ") for line in response.text.split("\n") if line]
    else:
        parts = [response.text] if response.text else []
    return response.status_code, [_without_sequence(part) for part in parts]


def _repeat_body(values: list[int]) -> dict[str, Any]:
    return {"IN": values, "DELAY": [10] * len(values), "WAIT": [0]}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param("ens_square/generate_stream", {"IN": 3}, id="stream-three"),
        pytest.param("ens_square/generate_stream", {"IN": 0}, id="stream-no-response"),
        pytest.param("ens_chain/generate_stream", {"IN": 2}, id="stream-two-decoupled-steps"),
        pytest.param("ens_nested/generate_stream", {"IN": 2}, id="stream-nested-ensemble"),
        pytest.param(
            "ens_repeat/generate_stream", _repeat_body([1, 2, 3]), id="stream-repeat-in-order"
        ),
        pytest.param(
            "ens_repeat/generate_stream",
            _repeat_body([1, 2, -3, 4]),
            id="stream-step-fails-midway",
        ),
        pytest.param("ens_raises/generate_stream", {"IN": -1}, id="stream-step-raises"),
        pytest.param("ens_square/generate_stream", {"NOPE": 1}, id="stream-missing-input"),
        pytest.param("ens_square/generate", {"IN": 1}, id="generate-one"),
        pytest.param("ens_square/generate", {"IN": 3}, id="generate-three-refused"),
        pytest.param("ens_raises/generate", {"IN": -1}, id="generate-step-raises"),
        pytest.param(
            "ens_square/infer",
            {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [2]}]},
            id="infer-refused",
        ),
    ],
)
def test_http_answers_as_triton(servers: ServerPair, path: str, body: dict[str, Any]):
    triton, zeroserve = (_post(base, path, body) for base in servers.http())
    assert zeroserve == triton


def _request(model: str, request_id: str, **inputs: list[int]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    for name, values in inputs.items():
        datatype, dtype = ("INT32", np.int32) if name == "IN" else ("UINT32", np.uint32)
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[len(values)])
        assert tensor is not None
        request.raw_input_contents.append(np.array(values, dtype).tobytes())
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


def _messages(address: str, request: pb.ModelInferRequest) -> list[str]:
    """The stream's messages for ``request`` as text, without Triton's sequence
    parameters, a bare final flag folded into the response before it."""
    folded: list[pb.ModelStreamInferResponse] = []
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        for message in call(iter([request]), timeout=TIMEOUT_S):
            response = message.infer_response
            for key in SEQUENCE_KEYS:
                response.parameters.pop(key, None)
            is_bare = not message.error_message and not response.outputs
            if is_bare and folded and not folded[-1].error_message:
                folded[-1].infer_response.parameters["triton_final_response"].bool_param = True
                continue
            folded.append(message)
    return [str(message) for message in folded]


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(_request("ens_square", "s2", IN=[2]), id="two-responses"),
        pytest.param(_request("ens_square", "s0", IN=[0]), id="bare-final-flag"),
        pytest.param(_request("ens_chain", "c2", IN=[2]), id="two-decoupled-steps"),
        pytest.param(_request("ens_nested", "n1", IN=[1]), id="nested-ensemble"),
        pytest.param(
            _request("ens_repeat", "r", IN=[5, -1, 6], DELAY=[10, 10, 10], WAIT=[0]),
            id="step-fails-midway",
        ),
        pytest.param(_request("ens_raises", "x", IN=[-1]), id="step-raises"),
        pytest.param(_request("ens_square", "bad", IN=[1, 2]), id="bad-shape"),
    ],
)
def test_grpc_stream_messages_are_tritons(servers: ServerPair, request_: pb.ModelInferRequest):
    triton, zeroserve = (_messages(address, request_) for address in servers.grpc())
    if request_.id == "bad":
        # zeroserve's shape error ends as later Triton's does, 2.51's with a space.
        triton = [text.replace("got [2]. ", "got [2].") for text in triton]
    assert zeroserve == triton


def _unary_refusal(address: str) -> tuple[grpc.StatusCode, str | None]:
    with grpc.insecure_channel(address) as channel:
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as raised:
            infer(_request("ens_square", "u", IN=[2]), timeout=TIMEOUT_S)
    error = raised.value
    assert isinstance(error, grpc.Call)
    return error.code(), error.details()


def test_unary_infer_of_a_decoupled_ensemble_is_refused_as_in_triton(servers: ServerPair):
    triton, zeroserve = (_unary_refusal(address) for address in servers.grpc())
    assert zeroserve == triton
    assert triton[0] == grpc.StatusCode.UNIMPLEMENTED


def test_the_ensemble_reads_as_decoupled_in_its_config(servers: ServerPair):
    for base in servers.http():
        config = httpx.get(f"{base}/v2/models/ens_nested/config", timeout=TIMEOUT_S).json()
        assert config["model_transaction_policy"] == {"decoupled": True}


def test_decoupled_and_plain_branches_meeting_are_refused_at_load(servers: ServerPair):
    """Compared on the first load only: Triton answers a second one with "no version is
    available"."""
    triton, zeroserve = (
        httpx.post(f"{base}/v2/repository/models/ens_mixed/load", timeout=TIMEOUT_S)
        for base in servers.http()
    )
    assert (zeroserve.status_code, zeroserve.json()) == (triton.status_code, triton.json())
    assert triton.status_code == 400
    assert "receives inputs originated from different decoupled models" in triton.text
