"""Triton Python-backend models, unchanged, through ``zeroserve up`` from S3.

Triton's ``add_sub`` example and its ``bls`` example (a model that calls another through
``pb_utils.InferenceRequest(...).exec()``) are uploaded to a real ``moto_server`` on
loopback, registered through the admin API at zero replicas, and answered by Triton's own
clients: ``tritonclient.http`` on the public port and ``tritonclient.grpc`` on ``--grpc-port``,
each request starting its model from zero. ``zeroserve up`` allows model code by default
(``ZEROSERVE_CONTROL_PLANE_ALLOW_MODEL_CODE``); the test sets it so that it says what it
relies on. AWS itself is not reached: moto stands in for it, as in ``test_platform_e2e``.

The BLS model's registration names its callee (``bls_models``: the control plane does not
read model code), so its first request, from zero, brings up ``add_sub`` with it on its
worker, loaded first, with only the BLS model published as a replica; ``add_sub``'s own
first request then gives it a placement of its own. Nothing here asserts a duration; every
wait has a deadline.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.data_plane.storage.s3_server import REGION, MotoServer
from tests.integration.conftest import free_port
from tests.integration.test_platform_e2e import (
    AUTH,
    Platform,
    admin_get,
    client,
    moto,
    platform_factory,
)
from tests.runtimes.python_backend import streaming_models, triton_models

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

__all__ = ["client", "moto", "platform_factory"]  # fixtures used by this module's tests

TIMEOUT_S = 90.0
"""Each client call's deadline: far above a cold start here, reached only on a hang."""


def upload(moto: MotoServer, folder: Path, bucket: str, prefix: str) -> None:
    s3 = moto.client()
    for path in folder.rglob("*"):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())


def write_bls_model(root: Path) -> Path:
    """Triton's ``bls`` example (sync ``exec``), the callee named by its MODEL_NAME input."""
    model = streaming_models.MODELS["bls_sync"]
    folder = root / "bls_sync"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(model.config.format(name="bls_sync"))
    (folder / "1" / "model.py").write_text(model.source)
    return folder


def infer_add_sub_http(url: str, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    with httpclient.InferenceServerClient(url, network_timeout=TIMEOUT_S) as triton:
        inputs = []
        for name, array in (("INPUT0", x), ("INPUT1", y)):
            tensor = httpclient.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        result = triton.infer("add_sub", inputs)
        return {name: result.as_numpy(name) for name in ("OUTPUT0", "OUTPUT1")}


def infer_bls_grpc(url: str, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    with grpcclient.InferenceServerClient(url) as triton:
        callee = grpcclient.InferInput("MODEL_NAME", [1], "BYTES")
        callee.set_data_from_numpy(np.array([b"add_sub"], dtype=object))
        inputs = [callee]
        for name, array in (("INPUT0", x), ("INPUT1", y)):
            tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = triton.infer("bls_sync", inputs, client_timeout=TIMEOUT_S)
        return {name: result.as_numpy(name) for name in ("OUTPUT0", "OUTPUT1")}


async def models_on_workers(client: httpx.AsyncClient, platform: Platform) -> list[list[str]]:
    workers = (await admin_get(client, platform, "/workers"))["workers"]
    return [sorted(worker["models"]) for worker in workers]


async def ready_on_worker(client: httpx.AsyncClient, platform: Platform) -> list[str]:
    """The models the only worker serves, placed or not (its repository index)."""
    (worker,) = (await admin_get(client, platform, "/workers"))["workers"]
    index = await client.post(f"{worker['url']}/v2/repository/index", json={"ready": True})
    assert index.status_code == 200, index.text
    return sorted(entry["name"] for entry in index.json())


async def test_triton_python_models_from_s3_scale_from_zero_and_answer_tritonclient(
    platform_factory: Callable[..., Platform],
    client: httpx.AsyncClient,
    moto: MotoServer,
    tmp_path: Path,
) -> None:
    bucket = f"python-models-{uuid.uuid4().hex[:12]}"
    moto.client().create_bucket(Bucket=bucket)
    local = tmp_path / "local"
    upload(moto, triton_models.write_model(local, "add_sub"), bucket, "repo/add_sub")
    upload(moto, write_bls_model(local), bucket, "repo/bls_sync")
    grpc_port = free_port()
    platform = platform_factory(
        "python-backend",
        "--max-workers",
        "1",
        "--grpc-port",
        str(grpc_port),
        AWS_ENDPOINT_URL=moto.url,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION=REGION,
        ZEROSERVE_ALLOWED_STORAGE=f"s3://{bucket}",
        ZEROSERVE_CONTROL_PLANE_ALLOW_MODEL_CODE="true",
    )
    for name, callees in (("add_sub", []), ("bls_sync", ["add_sub"])):
        body: dict[str, Any] = {
            "name": name,
            "storage_uri": f"s3://{bucket}/repo/{name}",
            "bls_models": callees,
            "scaling": {"min_replicas": 0, "idle_timeout_s": 600},
        }
        response = await client.post(f"{platform.admin}/admin/v1/models", json=body, headers=AUTH)
        assert response.status_code == 201, response.text
        status = (await admin_get(client, platform, f"/models/{name}"))["status"]
        assert status["state"] == "scaled_to_zero"
    assert await models_on_workers(client, platform) == []

    x = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    y = np.array([0.5, -1.0, 10.0, 2.0], dtype=np.float32)
    first = await asyncio.to_thread(infer_bls_grpc, f"127.0.0.1:{grpc_port}", y, x)
    np.testing.assert_array_equal(first["OUTPUT0"], y + x)
    np.testing.assert_array_equal(first["OUTPUT1"], y - x)
    assert await models_on_workers(client, platform) == [["bls_sync"]]
    assert await ready_on_worker(client, platform) == ["add_sub", "bls_sync"]
    activations = await admin_get(client, platform, "/models/bls_sync/activations")
    assert [a["outcome"] for a in activations["activations"]] == ["ready"]

    public = platform.public.removeprefix("http://")
    second = await asyncio.to_thread(infer_add_sub_http, public, x, y)
    np.testing.assert_array_equal(second["OUTPUT0"], x + y)
    np.testing.assert_array_equal(second["OUTPUT1"], x - y)
    assert await models_on_workers(client, platform) == [["add_sub", "bls_sync"]]
    platform.remember_workers()
