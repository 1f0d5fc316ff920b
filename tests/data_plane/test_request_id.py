"""A worker's error answers name the request's ``X-Request-ID`` (HTTP header, gRPC trailing
metadata), on every way in; bodies keep Triton's ``{"error": ...}`` shape and successful
answers stay exactly Triton's."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest

from data_plane.grpc.server import grpc_listener
from data_plane.routes.infer import DirectInfer
from data_plane.settings import ModelControlMode
from foundation.grpc_limits import GrpcLimits
from foundation.proto import grpc_service_pb2 as pb
from foundation.serving import HttpListener, bind_socket
from tests.data_plane.server_app import app_for, data_plane_core
from tests.models import write_onnx_add_sub

pytestmark = pytest.mark.anyio

WAIT_S = 60.0
REQUEST_ID = "req-7f3a"


@contextlib.asynccontextmanager
async def _served(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A real server with the direct infer path, as workers run."""
    repo = tmp_path / "models"
    write_onnx_add_sub(repo, "simple", dims=(4,))
    app, settings = app_for(repo, tmp_path / "cache", mode=ModelControlMode.NONE)
    listener = HttpListener(
        app,
        settings,
        bind_socket("127.0.0.1", 0),
        name="data plane",
        drain_timeout_s=5.0,
        direct=DirectInfer(),
        proxy_headers=False,
    )
    async with listener, httpx.AsyncClient(base_url=listener.url, timeout=WAIT_S) as client:
        yield client


def _infer_body(**tensors: list[float]) -> bytes:
    inputs = [
        {"name": name, "datatype": "FP32", "shape": [1, len(data)], "data": data}
        for name, data in tensors.items()
    ]
    return json.dumps({"inputs": inputs}).encode()


async def _chunked(body: bytes) -> AsyncIterator[bytes]:
    # No Content-Length: the request goes the ASGI way instead of the direct one.
    yield body


@pytest.mark.parametrize("way", ["direct", "asgi"])
async def test_an_infer_error_names_the_request_id_and_keeps_tritons_body(tmp_path: Path, way: str):
    body = _infer_body(INPUT0=[1.0, 2.0, 3.0, 4.0])  # INPUT1 missing
    headers = {"X-Request-ID": REQUEST_ID, "Content-Type": "application/json"}
    async with _served(tmp_path) as client:
        content = body if way == "direct" else _chunked(body)
        named = await client.post("/v2/models/simple/infer", content=content, headers=headers)
        unnamed = await client.post("/v2/models/simple/infer", content=body)
    assert named.status_code == unnamed.status_code == 400
    assert named.headers["x-request-id"] == REQUEST_ID
    assert "x-request-id" not in unnamed.headers
    assert named.json() == unnamed.json()
    assert list(named.json()) == ["error"]


async def test_other_errors_name_it_and_successes_do_not(tmp_path: Path):
    headers = {"X-Request-ID": REQUEST_ID}
    async with _served(tmp_path) as client:
        missing = await client.get("/v2/models/missing", headers=headers)
        served = await client.post(
            "/v2/models/simple/infer",
            content=_infer_body(INPUT0=[1.0] * 4, INPUT1=[2.0] * 4),
            headers=headers,
        )
        metadata = await client.get("/v2/models/simple", headers=headers)
    assert missing.status_code == 404
    assert missing.headers["x-request-id"] == REQUEST_ID
    assert list(missing.json()) == ["error"]
    assert served.status_code == metadata.status_code == 200
    assert "x-request-id" not in served.headers
    assert "x-request-id" not in metadata.headers


async def test_a_grpc_error_names_the_request_id_in_its_trailing_metadata(tmp_path: Path):
    repo = tmp_path / "models"
    write_onnx_add_sub(repo, "simple", dims=(4,))
    async with (
        data_plane_core(repo, tmp_path / "cache", load_models=("simple",)) as core,
        grpc_listener(
            lambda: core.handlers, GrpcLimits(), host="127.0.0.1", port=0, drain_timeout_s=5.0
        ) as port,
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        metadata_of = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelMetadata",
            request_serializer=pb.ModelMetadataRequest.SerializeToString,
            response_deserializer=pb.ModelMetadataResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as named:
            await metadata_of(
                pb.ModelMetadataRequest(name="missing"),
                metadata=(("x-request-id", REQUEST_ID),),
                timeout=WAIT_S,
            )
        with pytest.raises(grpc.aio.AioRpcError) as unnamed:
            await metadata_of(pb.ModelMetadataRequest(name="missing"), timeout=WAIT_S)
        answered = await metadata_of(
            pb.ModelMetadataRequest(name="simple"),
            metadata=(("x-request-id", REQUEST_ID),),
            timeout=WAIT_S,
        )
    assert named.value.code() == unnamed.value.code() == grpc.StatusCode.NOT_FOUND
    assert named.value.details() == unnamed.value.details()
    assert ("x-request-id", REQUEST_ID) in tuple(named.value.trailing_metadata() or ())
    assert "x-request-id" not in dict(unnamed.value.trailing_metadata() or ())
    assert answered.name == "simple"
