"""``zeroserve serve`` loading models from a real S3-compatible server (moto_server)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.data_plane.storage.s3_server import CREDENTIALS, REGION, MotoServer, start_moto
from tests.integration.conftest import ServerProcess
from tests.models import write_onnx_mlp

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = start_moto(tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def aws_env(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # The server process inherits these: boto3's own environment, as on a real node.
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDENTIALS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)


def upload_folder(moto: MotoServer, folder: Path, bucket: str, prefix: str) -> None:
    client = moto.client()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())


def infer_one(server: ServerProcess, model: str, x: np.ndarray) -> np.ndarray:
    response = httpx.post(
        f"{server.url}/v2/models/{model}/infer",
        json={
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "data": x.ravel().tolist(),
                }
            ]
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    return np.array(output["data"], dtype=np.float32).reshape(output["shape"])


def test_s3_model_repository_and_storage_uri_loads(
    moto: MotoServer, aws_env: None, tmp_path: Path, server_factory
):
    local = tmp_path / "local"
    write_onnx_mlp(local, "mlp", sizes=(16, 32, 8), max_batch_size=8)
    write_onnx_mlp(local, "other", sizes=(16, 32, 8), max_batch_size=8, seed=3)
    bucket = f"models-{uuid.uuid4().hex[:10]}"
    moto.client().create_bucket(Bucket=bucket)
    upload_folder(moto, local / "mlp", bucket, "repo/mlp")
    upload_folder(moto, local / "other", bucket, "elsewhere/other")
    os.environ["ZEROSERVE_ALLOWED_STORAGE"] = f"s3://{bucket}/elsewhere"
    try:
        server = server_factory(
            f"s3://{bucket}/repo", "--model-control-mode", "explicit", "--load-model", "mlp"
        )
    finally:
        del os.environ["ZEROSERVE_ALLOWED_STORAGE"]
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    session = ort.InferenceSession(str(local / "mlp" / "1" / "model.onnx"))
    np.testing.assert_allclose(
        infer_one(server, "mlp", x), session.run(None, {"INPUT0": x})[0], rtol=1e-5, atol=1e-5
    )
    index = httpx.post(f"{server.url}/v2/repository/index", timeout=30).json()
    assert {"name": "mlp", "version": "1", "state": "READY"} in index

    # A model outside the repository, placed by URI (as the control plane does).
    response = httpx.post(
        f"{server.url}/v2/repository/models/other/load",
        json={"parameters": {"storage_uri": f"s3://{bucket}/elsewhere/other"}},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    session = ort.InferenceSession(str(local / "other" / "1" / "model.onnx"))
    np.testing.assert_allclose(
        infer_one(server, "other", x), session.run(None, {"INPUT0": x})[0], rtol=1e-5, atol=1e-5
    )

    # A second load after unload is served from the node cache: no new GET of the weights.
    gets_before = moto.object_gets(bucket, "elsewhere/other/1/model.onnx")
    assert (
        httpx.post(f"{server.url}/v2/repository/models/other/unload", timeout=60).status_code == 200
    )
    response = httpx.post(
        f"{server.url}/v2/repository/models/other/load",
        json={"parameters": {"storage_uri": f"s3://{bucket}/elsewhere/other"}},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert moto.object_gets(bucket, "elsewhere/other/1/model.onnx") == gets_before

    # Storage outside the allowed roots and missing objects are clear load errors.
    for uri, text in (
        (f"s3://{bucket}/secret/other", "not under an allowed"),
        (f"s3://{bucket}/elsewhere/absent", "absent"),
        ("file:///etc", "not under an allowed"),
    ):
        response = httpx.post(
            f"{server.url}/v2/repository/models/x/load",
            json={"parameters": {"storage_uri": uri}},
            timeout=60,
        )
        assert response.status_code == 400, response.text
        assert (
            "failed to load 'x', failed to poll from model repository" in response.json()["error"]
        )
        assert text in response.json()["error"], response.json()["error"]
    assert httpx.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200
