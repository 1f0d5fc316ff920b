"""Model control over gRPC with ``tritonclient.grpc``: the repository index, load (with a
config override) and unload in explicit mode, and the same refusals as HTTP elsewhere."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from data_plane.settings import ModelControlMode  # noqa: E402
from foundation.proto import grpc_service_pb2 as pb  # noqa: E402
from tests.data_plane.grpc.serving import GrpcServing, serving  # noqa: E402
from tests.models import write_onnx_add_sub, write_onnx_mlp  # noqa: E402

CALL_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_onnx_add_sub(root, "add_sub", dtype="FP32", dims=(16,), max_batch_size=8)
    write_onnx_mlp(root, "mlp", sizes=(16, 32, 8), max_batch_size=32)
    return root


@pytest.fixture
def explicit(repo: Path, tmp_path: Path) -> Iterator[GrpcServing]:
    with serving(repo, tmp_path / "cache", mode=ModelControlMode.EXPLICIT) as running:
        yield running


@pytest.fixture
def client(explicit: GrpcServing) -> Iterator[Any]:
    c = grpcclient.InferenceServerClient(explicit.address)
    try:
        yield c
    finally:
        c.close()


def index(client: Any) -> dict[str, tuple[str, str]]:
    rows = client.get_model_repository_index(as_json=True).get("models", [])
    return {r["name"]: (r.get("version", ""), r.get("state", "")) for r in rows}


def test_load_infer_unload(client) -> None:
    assert index(client) == {"add_sub": ("", ""), "mlp": ("", "")}
    assert not client.is_model_ready("add_sub")
    client.load_model("add_sub")
    assert client.is_model_ready("add_sub")
    assert index(client)["add_sub"] == ("1", "READY")
    a = np.ones((1, 16), dtype=np.float32)
    inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)
    client.unload_model("add_sub")
    assert not client.is_model_ready("add_sub")
    with pytest.raises(InferenceServerException) as raised:
        client.infer("add_sub", inputs)
    assert raised.value.status() == "StatusCode.NOT_FOUND"
    assert (
        raised.value.message() == "Request for unknown model: 'add_sub' has no available versions"
    )


def test_load_with_a_config_override(client) -> None:
    config = {
        "name": "mlp",
        "backend": "onnxruntime",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [8]}],
    }
    client.load_model("mlp", config=json.dumps(config))
    assert client.get_model_config("mlp").config.max_batch_size == 4
    tensor = grpcclient.InferInput("INPUT0", [5, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((5, 16), dtype=np.float32))
    with pytest.raises(InferenceServerException) as raised:
        client.infer("mlp", [tensor])
    assert raised.value.message() == (
        "[request id: <id_unknown>] inference request batch-size must be <= 4 for 'mlp'"
    )


def test_load_refusals(client, explicit: GrpcServing) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("add_sub", config="{not json")
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    with grpc.insecure_channel(explicit.address) as channel:
        load = channel.unary_unary(
            "/inference.GRPCInferenceService/RepositoryModelLoad",
            request_serializer=pb.RepositoryModelLoadRequest.SerializeToString,
            response_deserializer=pb.RepositoryModelLoadResponse.FromString,
        )
        named = pb.RepositoryModelLoadRequest(model_name="add_sub", repository_name="other")
        with pytest.raises(grpc.RpcError) as refused:
            load(named, timeout=CALL_TIMEOUT_S)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert refused.value.details() == "'repository_name' specification is not supported"
        wrong_type = pb.RepositoryModelLoadRequest(model_name="add_sub")
        wrong_type.parameters["config"].bool_param = True
        with pytest.raises(grpc.RpcError) as refused:
            load(wrong_type, timeout=CALL_TIMEOUT_S)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not client.is_model_ready("add_sub")


def test_model_control_needs_explicit_mode(repo: Path, tmp_path: Path) -> None:
    with serving(repo, tmp_path / "cache", mode=ModelControlMode.NONE) as running:
        c = grpcclient.InferenceServerClient(running.address)
        try:
            assert c.is_model_ready("add_sub")
            calls: list[Callable[[], object]] = [
                lambda: c.load_model("add_sub"),
                lambda: c.unload_model("add_sub"),
            ]
            for call in calls:
                with pytest.raises(InferenceServerException) as raised:
                    call()
                assert raised.value.status() == "StatusCode.UNAVAILABLE"
                assert raised.value.message() == (
                    "explicit model load / unload is not allowed if polling is enabled"
                )
            assert c.is_model_ready("add_sub")
        finally:
            c.close()
