"""Infer requests answered past ASGI (`data_plane.routes.infer.DirectInfer`) get the answers
the ASGI app gives: the same request sent to one real data plane on loopback twice, once
with a Content-Length (answered directly) and once with a chunked body (which only the ASGI
app takes), gets the same status, headers and body, for answers and for errors (unknown
model and version, malformed JSON, a decoupled model, a Python model whose execute raises),
for binary tensors, compressed bodies both ways and a query string; a percent-encoded path
goes the ASGI way. A real ONNX model, real Triton-style Python models in stub processes."""

from __future__ import annotations

import contextlib
import gzip
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from data_plane.routes import infer as infer_route
from data_plane.routes.infer import DirectInfer
from data_plane.settings import ModelControlMode
from foundation.http_direct import DirectHandler, DirectResponse, Headers
from foundation.serving import HttpListener, bind_socket
from tests.data_plane.server_app import app_for
from tests.models import write_onnx_add_sub
from tests.runtimes.python_backend import streaming_models, triton_models

pytestmark = pytest.mark.anyio

WAIT_S = 60.0


class _Counted(DirectInfer):
    """DirectInfer, counting the requests it answers."""

    def __init__(self) -> None:
        self.taken: list[bytes] = []

    def route(
        self, method: bytes, path: bytes, state: Mapping[str, Any]
    ) -> tuple[DirectHandler, int] | None:
        routed = super().route(method, path, state)
        if routed is None:
            return None
        handler, max_body_bytes = routed

        async def counted(headers: Headers, body: bytes) -> DirectResponse:
            self.taken.append(path)
            return await handler(headers, body)

        return counted, max_body_bytes


@contextlib.asynccontextmanager
async def _data_plane(tmp_path: Path, routes: DirectInfer) -> AsyncIterator[httpx.AsyncClient]:
    repo = tmp_path / "models"
    write_onnx_add_sub(repo, "simple", dims=(4,))
    triton_models.write_model(repo, "execute_raises")
    streaming_models.write_repository(repo, ["repeat_int32"])
    app, settings = app_for(repo, tmp_path / "cache", mode=ModelControlMode.NONE)
    listener = HttpListener(
        app,
        settings,
        bind_socket("127.0.0.1", 0),
        name="data plane",
        drain_timeout_s=5.0,
        direct=routes,
        proxy_headers=False,
    )
    async with listener, httpx.AsyncClient(base_url=listener.url, timeout=WAIT_S) as client:
        yield client


async def _chunked(body: bytes) -> AsyncIterator[bytes]:
    # An iterator body makes httpx send it chunked, with no Content-Length.
    yield body[: len(body) // 2]
    yield body[len(body) // 2 :]


def _seen(response: httpx.Response) -> tuple[int, dict[str, str], bytes]:
    headers = {k: v for k, v in response.headers.items() if k not in ("date", "content-length")}
    return response.status_code, headers, response.content


def _json(**tensors: list[float]) -> bytes:
    inputs = [
        {"name": name, "datatype": "FP32", "shape": [1, len(data)], "data": data}
        for name, data in tensors.items()
    ]
    return json.dumps({"inputs": inputs}).encode()


def _binary() -> tuple[bytes, dict[str, str]]:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "FP32",
                    "shape": [1, 4],
                    "parameters": {"binary_data_size": 16},
                }
                for name in ("INPUT0", "INPUT1")
            ],
            "outputs": [{"name": "OUTPUT1", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + a.tobytes() + (2 * a).tobytes()
    return body, {"Inference-Header-Content-Length": str(len(header))}


REQUESTS: dict[str, tuple[str, bytes, dict[str, str]]] = {
    "answered": (
        "/v2/models/simple/infer",
        _json(INPUT0=[1, 2, 3, 4], INPUT1=[4, 3, 2, 1]),
        {"Content-Type": "application/json"},
    ),
    "versioned": ("/v2/models/simple/versions/1/infer", _json(INPUT0=[1] * 4, INPUT1=[2] * 4), {}),
    "query string": ("/v2/models/simple/infer?x=1", _json(INPUT0=[1] * 4, INPUT1=[2] * 4), {}),
    "binary": ("/v2/models/simple/infer", *_binary()),
    "gzip both ways": (
        "/v2/models/simple/infer",
        gzip.compress(_json(INPUT0=[5] * 4, INPUT1=[1] * 4)),
        {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"},
    ),
    "unknown model": ("/v2/models/nope/infer", _json(INPUT0=[1] * 4), {}),
    "unknown version": ("/v2/models/simple/versions/7/infer", _json(INPUT0=[1] * 4), {}),
    "malformed json": ("/v2/models/simple/infer", b'{"inputs": [', {}),
    "wrong input": ("/v2/models/simple/infer", _json(NOPE=[1] * 4), {}),
    "decoupled": ("/v2/models/repeat_int32/infer", _json(IN=[1]), {}),
    "execute raises": (
        "/v2/models/execute_raises/infer",
        b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]}]}',
        {},
    ),
}


ANSWERED = ("answered", "versioned", "query string", "binary", "gzip both ways")


@pytest.mark.parametrize("case", list(REQUESTS))
async def test_direct_answers_are_the_asgi_apps(tmp_path: Path, case: str) -> None:
    path, body, headers = REQUESTS[case]
    routes = _Counted()
    async with _data_plane(tmp_path, routes) as client:
        direct = await client.post(path, content=body, headers=headers)
        taken = len(routes.taken)
        through_asgi = await client.post(path, content=_chunked(body), headers=headers)

    assert taken == 1 and len(routes.taken) == 1  # the chunked one was not taken
    assert _seen(direct) == _seen(through_asgi)
    assert (direct.status_code == 200) == (case in ANSWERED), direct.text


async def test_answers_and_errors_are_triton_s(tmp_path: Path) -> None:
    routes = _Counted()
    async with _data_plane(tmp_path, routes) as client:
        answered = await client.post("/v2/models/simple/infer", content=REQUESTS["answered"][1])
        unknown = await client.post("/v2/models/nope/infer", content=REQUESTS["unknown model"][1])
        decoupled = await client.post(
            "/v2/models/repeat_int32/infer", content=REQUESTS["decoupled"][1]
        )
        raises = await client.post(
            "/v2/models/execute_raises/infer", content=REQUESTS["execute raises"][1]
        )
        encoded = await client.post("/v2/models/%73imple/infer", content=REQUESTS["answered"][1])

    assert answered.status_code == 200
    outputs = {o["name"]: o["data"] for o in answered.json()["outputs"]}
    assert outputs == {"OUTPUT0": [5, 5, 5, 5], "OUTPUT1": [-3, -1, 1, 3]}
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "Request for unknown model: 'nope' is not found"}
    assert decoupled.status_code == 501
    assert decoupled.json() == {
        "error": "HTTP end point doesn't support models with decoupled transaction policy"
    }
    assert raises.status_code == 500
    assert "this model cannot execute" in raises.json()["error"]
    # A percent-encoded path is decoded by the ASGI way, which answers it.
    assert encoded.status_code == 200 and encoded.json() == answered.json()
    assert b"/v2/models/%73imple/infer" not in routes.taken
    assert len(routes.taken) == 4


async def test_an_unexpected_failure_is_the_same_logged_500_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No request makes the decoder fail unexpectedly, so one is made to.
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("decoder bug")

    monkeypatch.setattr(infer_route, "decode_infer_request", broken)
    path, body, headers = REQUESTS["answered"]
    async with _data_plane(tmp_path, _Counted()) as client:
        direct = await client.post(path, content=body, headers=headers)
        through_asgi = await client.post(path, content=_chunked(body), headers=headers)

    assert _seen(direct) == _seen(through_asgi)
    assert direct.status_code == 500
    assert direct.json() == {"error": "internal server error"}
