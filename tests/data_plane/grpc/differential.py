"""Differential testing against real Triton: the same gRPC request to Triton and to
zeroserve, and what each answered.

Both repositories hold the same models under the same names and configs: ONNX models for
zeroserve, Python-backend models computing the same for Triton (its wheel has no ONNX
backend).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.message import Message

from foundation.proto import grpc_service_pb2 as pb
from tests.models import read_config, write_onnx_add_sub, write_onnx_identity
from tests.triton_oracle import ADD_SUB_MODEL, IDENTITY_MODEL, write_python_backend_model

CALL_TIMEOUT_S = 60.0
SERVICE = "/inference.GRPCInferenceService/"
IDENTITY_DATATYPES = ("BYTES", "BOOL", "INT8", "UINT16", "FP16", "FP32")
"""The Identity models both repositories hold (``identity_<datatype>``); BF16 is left out:
the Python backend's numpy has no such type."""


def write_twin_repositories(zeroserve_repo: Path, triton_repo: Path) -> None:
    """``add_sub`` (FP32 [16], batching up to 8) and ``identity_<datatype>`` ([-1], batching
    up to 8) in both repositories."""
    models = [write_onnx_add_sub(zeroserve_repo, "add_sub", dims=(16,), max_batch_size=8)]
    for datatype in IDENTITY_DATATYPES:
        models.append(
            write_onnx_identity(zeroserve_repo, f"identity_{datatype.lower()}", datatype=datatype)
        )
    for model_dir in models:
        source = ADD_SUB_MODEL if model_dir.name == "add_sub" else IDENTITY_MODEL
        write_python_backend_model(triton_repo, read_config(model_dir), source)


@dataclass(frozen=True)
class Outcome:
    """What one server answered: a status code's name, its details, and the response when
    the code is OK."""

    code: str
    details: str
    response: Message | None = None


def call(
    channel: grpc.Channel, method: str, request: Message | bytes, response_class: type[Message]
) -> Outcome:
    """One unary call; ``request`` may be raw bytes, sent as they are."""
    payload = request if isinstance(request, bytes) else request.SerializeToString()
    stub: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(SERVICE + method)
    try:
        data = stub(payload, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        return Outcome(exc.code().name, exc.details() or "")
    return Outcome("OK", "", response_class.FromString(data))


def stream(channel: grpc.Channel, requests: Iterable[Message]) -> list[pb.ModelStreamInferResponse]:
    """Every response of one ModelStreamInfer stream carrying ``requests``."""
    stub: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
        SERVICE + "ModelStreamInfer"
    )
    payloads = (r.SerializeToString() for r in requests)
    return [
        pb.ModelStreamInferResponse.FromString(d) for d in stub(payloads, timeout=CALL_TIMEOUT_S)
    ]


@dataclass(frozen=True)
class Case:
    """One request to send to both servers.

    ``same_text``: the status details must match too, not only the code (where Triton's text
    is the one clients match on, or where zeroserve's is Triton's). ``compare`` checks two OK
    responses against each other (Triton's first).
    """

    label: str
    method: str
    request: Message | bytes
    response_class: type[Message]
    same_text: bool = True
    compare: Callable[[Message, Message], None] | None = None

    def __str__(self) -> str:
        return self.label


def check(case: Case, triton: grpc.Channel, zeroserve: grpc.Channel) -> tuple[Outcome, Outcome]:
    """Send ``case`` to both and assert the same code (and text, and responses, as the
    case asks); returns both outcomes."""
    expected = call(triton, case.method, case.request, case.response_class)
    actual = call(zeroserve, case.method, case.request, case.response_class)
    assert actual.code == expected.code, (expected, actual)
    if case.same_text:
        assert actual.details == expected.details
    if expected.response is not None and actual.response is not None:
        if case.compare is not None:
            case.compare(expected.response, actual.response)
        else:
            assert actual.response == expected.response
    return expected, actual


@contextmanager
def channel_to(address: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(address) as opened:
        grpc.channel_ready_future(opened).result(timeout=CALL_TIMEOUT_S)
        yield opened
