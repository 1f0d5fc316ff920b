"""The data plane's app answers infer requests before Starlette's middleware stack
(`data_plane.routes.infer.InferFirst`): a middleware put at the stack's top sees every other
request and no infer request, whether the infer is answered or refused. In process, a real
ONNX model, requests through httpx's ASGI transport."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from data_plane.settings import ModelControlMode
from tests.data_plane.server_app import data_plane
from tests.models import write_onnx_add_sub

pytestmark = pytest.mark.anyio


class _Seen:
    """A middleware recording the paths that enter the stack."""

    paths: list[tuple[str, str]] = []

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.paths.append((scope["method"], scope["path"]))
        await self.app(scope, receive, send)


async def test_infer_requests_skip_the_middleware_stack_and_the_rest_go_through(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "models"
    write_onnx_add_sub(repo, "simple", dims=(4,))
    _Seen.paths = []
    async with data_plane(
        repo,
        tmp_path / "cache",
        mode=ModelControlMode.NONE,
        outer_middleware=[Middleware(_Seen)],
    ) as client:
        a = [1.0, 2.0, 3.0, 4.0]
        body = {
            "inputs": [
                {"name": n, "datatype": "FP32", "shape": [1, 4], "data": a}
                for n in ("INPUT0", "INPUT1")
            ]
        }
        answered = await client.post("/v2/models/simple/infer", json=body)
        versioned = await client.post("/v2/models/simple/versions/1/infer", json=body)
        unknown = await client.post("/v2/models/nope/infer", json=body)
        live = await client.get("/v2/health/live")
        wrong_method = await client.get("/v2/models/simple/infer")

    assert answered.status_code == versioned.status_code == 200
    outputs = {o["name"]: o["data"] for o in answered.json()["outputs"]}
    np.testing.assert_allclose(outputs["OUTPUT0"], np.add(a, a))
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "Request for unknown model: 'nope' is not found"}
    assert live.status_code == 200
    assert wrong_method.status_code == 405  # Starlette's routing, as Triton answers it
    assert _Seen.paths == [("GET", "/v2/health/live"), ("GET", "/v2/models/simple/infer")]
