"""The official ``tritonclient.http`` against ``zeroserve serve``, unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

tritonhttp = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.integration.conftest import ServerProcess, start_server  # noqa: E402
from tests.models import write_onnx_add_sub, write_onnx_identity, write_onnx_mlp  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_onnx_add_sub(root, "simple_int32", dtype="INT32", dims=(16,), max_batch_size=8)
    write_onnx_add_sub(root, "simple_fp32", dtype="FP32", dims=(16,), max_batch_size=8)
    write_onnx_identity(root, "strings", datatype="BYTES", dims=(-1,), max_batch_size=8)
    write_onnx_mlp(root, "mlp", sizes=(16, 32, 8), max_batch_size=32)
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory):
    process = start_server(
        repo,
        tmp_path_factory.mktemp("logs"),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
    )
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def client(server: ServerProcess):
    c = tritonhttp.InferenceServerClient(server.address, concurrency=8)
    try:
        yield c
    finally:
        c.close()


def test_health_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("simple_int32")
    assert not client.is_model_ready("no_such_model")
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    meta = client.get_model_metadata("simple_int32")
    assert [i["name"] for i in meta["inputs"]] == ["INPUT0", "INPUT1"]
    config = client.get_model_config("simple_int32")
    assert config["max_batch_size"] == 8


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize(
    ("model", "dtype", "datatype"),
    [("simple_int32", np.int32, "INT32"), ("simple_fp32", np.float32, "FP32")],
)
def test_add_sub(client, binary: bool, model: str, dtype: type, datatype: str):
    a: np.ndarray = np.arange(16, dtype=dtype).reshape(1, 16)
    b: np.ndarray = np.ones((1, 16), dtype=dtype)
    inputs = [
        tritonhttp.InferInput("INPUT0", [1, 16], datatype),
        tritonhttp.InferInput("INPUT1", [1, 16], datatype),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    outputs = [
        tritonhttp.InferRequestedOutput("OUTPUT0", binary_data=binary),
        tritonhttp.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer(model, inputs, outputs=outputs, request_id="abc")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["id"] == "abc"


def test_default_call_asks_for_binary_outputs(client):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [
        tritonhttp.InferInput("INPUT0", [1, 16], "INT32"),
        tritonhttp.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer("simple_int32", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
    assert result.get_output("OUTPUT0")["parameters"]["binary_data_size"] == 64


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes(client, binary: bool):
    data = np.array([[b"alpha", b"", b"\xce\xbb"]], dtype=np.object_)
    tensor = tritonhttp.InferInput("INPUT0", [1, 3], "BYTES")
    tensor.set_data_from_numpy(data, binary_data=binary)
    out = tritonhttp.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer("strings", [tensor], outputs=[out])
    got = result.as_numpy("OUTPUT0")
    assert [bytes(v) if not isinstance(v, str) else v.encode() for v in got.ravel()] == [
        b"alpha",
        b"",
        b"\xce\xbb",
    ]


def test_compressed_request_and_response(client):
    a = np.full((1, 16), 2, dtype=np.int32)
    inputs = [
        tritonhttp.InferInput("INPUT0", [1, 16], "INT32"),
        tritonhttp.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    for algorithm in ("gzip", "deflate"):
        result = client.infer(
            "simple_int32",
            inputs,
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


def test_async_requests_batch(client, repo: Path):
    x = np.random.default_rng(3).standard_normal((48, 1, 16)).astype(np.float32)
    before = client.get_inference_statistics("mlp")["model_stats"][0]
    pending = []
    for row in x:
        tensor = tritonhttp.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(row)
        pending.append(client.async_infer("mlp", [tensor]))
    results = [p.get_result(timeout=120) for p in pending]
    session = ort.InferenceSession(str(repo / "mlp" / "1" / "model.onnx"))
    expected = session.run(None, {"INPUT0": x.reshape(48, 16)})[0]
    for i, result in enumerate(results):
        np.testing.assert_allclose(result.as_numpy("OUTPUT0")[0], expected[i], rtol=1e-4, atol=1e-5)
    stats = client.get_inference_statistics("mlp")["model_stats"][0]
    assert stats["inference_count"] - before["inference_count"] == 48
    assert stats["execution_count"] - before["execution_count"] <= 48


def test_repository_control(client):
    index = client.get_model_repository_index()
    assert {"name": "mlp", "version": "1", "state": "READY"} in index
    client.unload_model("mlp")
    assert not client.is_model_ready("mlp")
    client.load_model("mlp")
    assert client.is_model_ready("mlp")


def test_errors_raise_with_the_servers_message(client):
    tensor = tritonhttp.InferInput("INPUT0", [1, 15], "INT32")
    tensor.set_data_from_numpy(np.zeros((1, 15), dtype=np.int32))
    other = tritonhttp.InferInput("INPUT1", [1, 16], "INT32")
    other.set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
    with pytest.raises(InferenceServerException, match="unexpected shape for input 'INPUT0'"):
        client.infer("simple_int32", [tensor, other])
    with pytest.raises(InferenceServerException, match="missing required input"):
        client.infer("simple_int32", [other])
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("nope", [tensor])
