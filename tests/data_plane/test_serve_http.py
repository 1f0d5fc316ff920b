"""The data plane's HTTP API in process (its lifespan run, requests through httpx's ASGI
transport): health, metadata, config, infer in JSON and binary, compression, batching,
statistics, metrics and Triton's errors. ``tests/integration/test_serve_http.py`` keeps what
needs a real ``zeroserve serve`` process."""

from __future__ import annotations

import asyncio
import gzip
import json
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from data_plane.settings import ModelControlMode
from tests.data_plane.server_app import data_plane
from tests.models import write_onnx_add_sub, write_onnx_identity, write_onnx_mlp, write_python_model

pytestmark = pytest.mark.anyio


def engine_alone(model_dir: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model_dir / "1" / "model.onnx"))
    return np.asarray(session.run(None, {"INPUT0": x})[0])


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module scope: one server (one set of model loads) for the module


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_onnx_mlp(root, "mlp", sizes=(16, 32, 8), max_batch_size=32)
    write_onnx_add_sub(root, "simple", dtype="INT32", dims=(16,), max_batch_size=8)
    write_onnx_identity(root, "strings", datatype="BYTES", dims=(-1,), max_batch_size=8)
    write_onnx_identity(root, "halfs", datatype="FP16", dims=(-1,), max_batch_size=8)
    write_python_model(root, "pydouble")
    write_onnx_mlp(root, "autoconfig", sizes=(4, 8, 2), config=False)
    return root


@pytest.fixture(scope="module")
async def client(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    # Mode none, as ``zeroserve serve`` runs by default: every model loads at start.
    async with data_plane(repo, tmp_path_factory.mktemp("cache"), mode=ModelControlMode.NONE) as c:
        yield c


async def test_health_and_server_metadata(client: httpx.AsyncClient):
    assert (await client.get("/v2/health/live")).status_code == 200
    assert (await client.get("/v2/health/ready")).status_code == 200
    meta = (await client.get("/v2")).json()
    assert meta["name"] == "triton"
    assert "binary_tensor_data" in meta["extensions"]
    assert "model_repository" in meta["extensions"]


async def test_model_metadata_config_and_ready(client: httpx.AsyncClient):
    meta = (await client.get("/v2/models/mlp")).json()
    assert meta == {
        "name": "mlp",
        "versions": ["1"],
        "platform": meta["platform"],
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 8]}],
    }
    assert meta["platform"] in ("onnxruntime", "onnxruntime_onnx")
    assert (await client.get("/v2/models/mlp/versions/1")).json()["versions"] == ["1"]
    config = (await client.get("/v2/models/mlp/config")).json()
    assert config["max_batch_size"] == 32
    assert config["input"][0]["dims"] == [16]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert (await client.get("/v2/models/mlp/ready")).status_code == 200
    assert (await client.get("/v2/models/mlp/versions/1/ready")).status_code == 200


async def test_an_onnx_model_without_config_gets_tritons_instance_count(client: httpx.AsyncClient):
    # No config.pbtxt: the ONNX Runtime backend's default on CPU, two instances, as Triton.
    group = (await client.get("/v2/models/autoconfig/config")).json()["instance_group"][0]
    assert (group["kind"], group["count"]) == ("KIND_CPU", 2)


async def test_infer_json_matches_the_engine_alone(client: httpx.AsyncClient, repo: Path):
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    response = await client.post(
        "/v2/models/mlp/infer",
        json={
            "id": "req-7",
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [3, 16], "data": x.tolist()}
            ],
        },
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["id"] == "req-7"
    assert body["model_name"] == "mlp"
    assert body["model_version"] == "1"
    (output,) = body["outputs"]
    assert output["name"] == "OUTPUT0" and output["shape"] == [3, 8]
    got = np.array(output["data"], dtype=np.float32).reshape(3, 8)
    np.testing.assert_allclose(got, engine_alone(repo / "mlp", x), rtol=1e-5, atol=1e-5)


async def test_infer_binary_both_ways_and_output_subset(client: httpx.AsyncClient):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": 64},
                },
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.tolist()},
            ],
            "outputs": [{"name": "OUTPUT1", "parameters": {"binary_data": True}}],
        }
    ).encode()
    response = await client.post(
        "/v2/models/simple/infer",
        content=header + a.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    length = int(response.headers["inference-header-content-length"])
    meta = json.loads(response.content[:length])
    assert [o["name"] for o in meta["outputs"]] == ["OUTPUT1"]
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == 64
    got = np.frombuffer(response.content[length:], dtype="<i4").reshape(1, 16)
    np.testing.assert_array_equal(got, a - b)


async def test_bytes_tensors_binary_and_json(client: httpx.AsyncClient):
    values = [b"hello", b"", "h\u00e9".encode()]
    payload = b"".join(struct.pack("<I", len(v)) + v for v in values)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "BYTES",
                    "shape": [1, 3],
                    "parameters": {"binary_data_size": len(payload)},
                }
            ],
        }
    ).encode()
    response = await client.post(
        "/v2/models/strings/infer",
        content=header + payload,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == ["hello", "", "h\u00e9"]


async def test_python_model_serves(client: httpx.AsyncClient):
    response = await client.post(
        "/v2/models/pydouble/infer",
        json={
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]}
            ]
        },
    )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [2, 4, 6, 8]


async def test_gzip_and_deflate_request_bodies_and_compressed_response(client: httpx.AsyncClient):
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
    raw = json.dumps(doc).encode()
    for encoding, body in (("gzip", gzip.compress(raw)), ("deflate", zlib.compress(raw))):
        response = await client.post(
            "/v2/models/mlp/infer",
            content=body,
            headers={"Content-Encoding": encoding, "Accept-Encoding": "gzip"},
        )
        assert response.status_code == 200, response.text
        assert response.headers["content-encoding"] == "gzip"
        assert response.json()["outputs"][0]["shape"] == [1, 8]


async def test_concurrent_requests_batch_and_each_gets_its_own_rows(
    client: httpx.AsyncClient, repo: Path
):
    before = (await client.get("/v2/models/mlp/stats")).json()["model_stats"][0]
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((96, 1, 16)).astype(np.float32)

    # One in-process client: the ASGI requests run concurrently on its event loop.
    responses = await asyncio.gather(
        *(
            client.post(
                "/v2/models/mlp/infer",
                json={
                    "id": str(i),
                    "inputs": [
                        {
                            "name": "INPUT0",
                            "datatype": "FP32",
                            "shape": [1, 16],
                            "data": xs[i].tolist(),
                        }
                    ],
                },
            )
            for i in range(96)
        )
    )
    expected = engine_alone(repo / "mlp", xs.reshape(96, 16))
    for i, response in enumerate(responses):
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["id"] == str(i)
        got = np.array(body["outputs"][0]["data"], dtype=np.float32)
        np.testing.assert_allclose(got, expected[i], rtol=1e-4, atol=1e-5)
    after = (await client.get("/v2/models/mlp/stats")).json()["model_stats"][0]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 96
    assert executions < inferences
    assert any(b["batch_size"] > 1 for b in after["batch_stats"])


async def test_statistics_have_tritons_shape(client: httpx.AsyncClient):
    await client.post(
        "/v2/models/simple/infer",
        json={
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
            ]
        },
    )
    stats = (await client.get("/v2/models/simple/stats")).json()["model_stats"][0]
    assert stats["name"] == "simple" and stats["version"] == "1"
    assert stats["inference_count"] >= 1 and stats["execution_count"] >= 1
    assert stats["last_inference"] > 0
    inference = stats["inference_stats"]
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
        assert set(inference[key]) == {"count", "ns"}
    assert inference["queue"]["count"] == inference["success"]["count"]
    all_stats = (await client.get("/v2/models/stats")).json()["model_stats"]
    assert {s["name"] for s in all_stats} >= {"mlp", "simple"}


async def test_metrics_use_tritons_names(client: httpx.AsyncClient):
    text = (await client.get("/metrics")).text
    assert "# TYPE nv_inference_request_success counter" in text
    assert 'nv_inference_request_success{model="mlp",version="1"}' in text
    assert 'nv_inference_request_failure{model="mlp",reason="BACKEND",version="1"}' in text
    assert "nv_inference_exec_count{" in text
    assert "nv_inference_pending_request_count{" in text
    assert 'nv_model_load_duration_secs{model="mlp",version="1"}' in text
    assert "nv_inference_request_success_total" not in text
    assert "zeroserve_model_load_seconds" in text


@pytest.mark.parametrize(
    ("model", "body", "status", "message"),
    [
        pytest.param("mlp", b"{not json", 400, "", id="malformed-json"),
        pytest.param("mlp", b'{"inputs": 3}', 400, "", id="inputs-not-array"),
        pytest.param(
            "mlp",
            {"inputs": [{"name": "BOGUS", "datatype": "FP32", "shape": [1, 16], "data": [0] * 16}]},
            400,
            "unexpected inference input 'BOGUS' for model 'mlp'",
            id="unknown-tensor",
        ),
        pytest.param(
            "mlp",
            {
                "inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [1, 15], "data": [0] * 15}
                ]
            },
            400,
            "unexpected shape for input 'INPUT0' for model 'mlp'. Expected [-1,16], got [1,15].",
            id="wrong-shape",
        ),
        pytest.param(
            "mlp",
            {
                "inputs": [
                    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [0] * 16}
                ]
            },
            400,
            "inference input 'INPUT0' data-type is 'INT32', but model 'mlp' expects 'FP32'",
            id="wrong-datatype",
        ),
        pytest.param(
            "mlp",
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0] * 3}]},
            400,
            "shape does not match true shape",
            id="wrong-element-count",
        ),
        pytest.param(
            "mlp",
            {
                "inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [64, 16], "data": [0] * 1024}
                ]
            },
            400,
            "inference request batch-size must be <= 32 for 'mlp'",
            id="batch-too-large",
        ),
        pytest.param(
            "simple",
            {
                "inputs": [
                    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [0] * 16}
                ]
            },
            400,
            "expected 2 inputs but got 1 inputs for model 'simple'",
            id="missing-input",
        ),
        pytest.param(
            "nope",
            {"inputs": []},
            404,
            "Request for unknown model: 'nope' is not found",
            id="unknown-model",
        ),
        pytest.param(
            "halfs",
            {"inputs": [{"name": "INPUT0", "datatype": "FP16", "shape": [1, 1], "data": [1.0]}]},
            400,
            "receiving FP16 data via JSON is not supported",
            id="fp16-json",
        ),
    ],
)
async def test_bad_input_gets_tritons_status_and_error(
    client: httpx.AsyncClient, model: str, body: object, status: int, message: str
):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await client.post(f"/v2/models/{model}/infer", content=content)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert message in error


async def test_binary_byte_size_mismatch_is_rejected(client: httpx.AsyncClient):
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": 60},
                }
            ]
        }
    ).encode()
    response = await client.post(
        "/v2/models/mlp/infer",
        content=header + b"\0" * 60,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 400
    assert "input byte size mismatch for input 'INPUT0' for model 'mlp'" in response.json()["error"]


async def test_unknown_version_route_and_method(client: httpx.AsyncClient):
    response = await client.get("/v2/models/mlp/versions/9")
    assert response.status_code == 404
    assert "version 9 is not found" in response.json()["error"]
    assert (await client.get("/v2/no/such/path")).json() == {"error": "Not Found"}
    response = await client.get("/v2/models/mlp/infer")
    assert response.status_code == 405
    assert response.json() == {"error": "Method Not Allowed"}


async def test_load_and_unload_are_refused_outside_explicit_mode(client: httpx.AsyncClient):
    response = await client.post("/v2/repository/models/mlp/load")
    assert response.status_code == 503
    assert "explicit model load / unload is not allowed" in response.json()["error"]
    index = (await client.post("/v2/repository/index")).json()
    assert {"name": "mlp", "version": "1", "state": "READY"} in index
