"""API keys and quotas through a real ``zeroserve up`` (keys on, as by default), from zero:
curl-style httpx, ``tritonclient.http`` and ``tritonclient.grpc`` with ``headers=``, and the
official ``openai`` client with ``api_key``. A valid key is served; a missing, wrong,
expired, revoked or out-of-scope key is refused with the documented codes; a key revoked
while its stream is open ends its later requests, not the server; a key over a quota gets
429 / RESOURCE_EXHAUSTED. Finally no key appears in any log the platform wrote.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from foundation.keys import parse_key
from tests.integration.conftest import free_port
from tests.integration.test_platform_e2e import (
    AUTH,
    SIZES,
    TOKEN,
    Platform,
    admin_get,
    eventually,
    mlp_input,
    register,
    start_platform,
)
from tests.llm_model import prompt, write_tiny_llm
from tests.models import load_mlp_weights, mlp_reference, write_onnx_mlp, write_python_model

openai = pytest.importorskip("openai")
grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

WAIT_S = 120.0


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


GATED_MODEL = """\
import time
from pathlib import Path


class TritonPythonModel:
    def execute(self, inputs):
        gate = Path("{gate}")
        (gate.parent / "q_gate_waiting").touch()
        deadline = time.monotonic() + 120
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return {{"OUTPUT0": inputs["INPUT0"]}}
"""
"""A model that answers only once the file ``gate`` exists, and says it is waiting."""


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Platform, str, Path]]:
    """``zeroserve up`` with keys on (its default) and gRPC, the address of its gRPC
    endpoint, and the folder every log of it goes to."""
    tmp_path = tmp_path_factory.mktemp("keys")
    grpc_port = free_port()
    started = start_platform(
        tmp_path, "keys", "--grpc-port", str(grpc_port), ZEROSERVE_ACTIVATOR_AUTH="keys"
    )
    try:
        yield started, f"127.0.0.1:{grpc_port}", tmp_path
    finally:
        started.stop()
        leftovers = started.wait_workers_gone()
        started.kill_leftovers()
        assert not leftovers, f"orphan workers {leftovers}"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=WAIT_S) as client:
        yield client


@pytest.fixture(scope="module")
def tokens() -> list[str]:
    """Every key the tests make, to look for in the logs at the end."""
    return []


async def create_key(http: httpx.AsyncClient, up: Platform, tokens: list[str], **body: Any) -> str:
    response = await http.post(
        f"{up.admin}/admin/v1/keys", json={"name": "e2e", **body}, headers=AUTH
    )
    assert response.status_code == 201, response.text
    token = str(response.json()["key"])
    tokens.append(token)
    return token


async def cli(up: Platform, *args: str) -> subprocess.CompletedProcess[str]:
    """``zeroserve keys <args>`` against the platform's admin API; must succeed."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "zeroserve.cli", "keys", *args],
        env={**os.environ, "ZEROSERVE_ADMIN_URL": up.admin, "ZEROSERVE_ADMIN_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def key_id(token: str) -> str:
    parsed = parse_key(token)
    assert parsed is not None
    return parsed[0]


async def revoke(http: httpx.AsyncClient, up: Platform, token: str) -> None:
    response = await http.post(f"{up.admin}/admin/v1/keys/{key_id(token)}/revoke", headers=AUTH)
    assert response.status_code == 200, response.text


def infer_body(x: np.ndarray) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": list(x.shape),
                "data": x.ravel().tolist(),
            }
        ]
    }


def _inputs(module: Any, x: np.ndarray) -> list[Any]:
    tensor = module.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


async def test_keys_on_http_and_tritonclient_http(
    platform: tuple[Platform, str, Path], http: httpx.AsyncClient, tokens: list[str]
) -> None:
    up, _, _ = platform
    model_dir = write_onnx_mlp(up.models_dir, "k_mlp", SIZES, seed=31)
    other_dir = write_onnx_mlp(up.models_dir, "k_other", SIZES, seed=32)
    await register(http, up, model_dir)
    await register(http, up, other_dir)
    # One key made as a user would, with the CLI: printed once, on its last line.
    made = await cli(up, "create", "cli", "--model", "k_*")
    full = made.stdout.strip().splitlines()[-1]
    tokens.append(full)
    scoped = await create_key(http, up, tokens, models=["k_mlp"])
    expired = await create_key(http, up, tokens, expires_at=1_000_000.0)
    revoked = await create_key(http, up, tokens)
    assert "revoked key" in (await cli(up, "revoke", key_id(revoked))).stdout
    listed = json.loads((await cli(up, "-o", "json", "ls")).stdout)["keys"]
    states = {k["id"]: k["state"] for k in listed}
    assert states[key_id(revoked)] == "revoked" and states[key_id(expired)] == "expired"
    assert states[key_id(full)] == states[key_id(scoped)] == "active"
    table = (await cli(up, "ls")).stdout
    assert all(secret.rsplit("_", 1)[1] not in table for secret in tokens)
    x = mlp_input(31)
    url = f"{up.public}/v2/models/k_mlp/infer"

    # Health and server metadata stay open; everything about models needs a key.
    for path in ("/v2/health/live", "/v2/health/ready", "/v2"):
        assert (await http.get(f"{up.public}{path}")).status_code == 200
    refusals = {
        "missing": {},
        "not bearer": {"Authorization": f"Basic {full}"},
        "malformed": bearer("not-a-key"),
        "wrong secret": bearer(full[:-4] + ("aaaa" if not full.endswith("aaaa") else "bbbb")),
        "unknown id": bearer("zs_000000000000_" + full.rsplit("_", 1)[1]),
        "expired": bearer(expired),
        "revoked": bearer(revoked),
    }
    for what, headers in refusals.items():
        response = await http.post(url, json=infer_body(x), headers=headers)
        assert response.status_code == 401, (what, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
        assert "error" in response.json()
    assert (await http.get(f"{up.public}/v2/models/k_mlp/ready")).status_code == 401
    assert (await admin_get(http, up, "/models/k_mlp"))["status"]["state"] == "scaled_to_zero"

    # Out of scope: 403, the same for a registered model and for one nobody registered.
    forbidden = [
        await http.post(
            f"{up.public}/v2/models/{name}/infer", json=infer_body(x), headers=bearer(scoped)
        )
        for name in ("k_other", "k_ghost")
    ]
    assert [r.status_code for r in forbidden] == [403, 403]
    assert [r.json()["error"].replace("k_ghost", "k_other") for r in forbidden] == [
        forbidden[0].json()["error"]
    ] * 2

    # A valid key is served, from zero (curl-style), then through tritonclient.http.
    response = await http.post(url, json=infer_body(x), headers=bearer(scoped))
    assert response.status_code == 200, response.text
    expected = mlp_reference(load_mlp_weights(model_dir), x)
    output = np.array(response.json()["outputs"][0]["data"], dtype=np.float32)
    np.testing.assert_allclose(output.reshape(expected.shape), expected, rtol=1e-4, atol=1e-5)
    # tritonclient.http runs on gevent, so it is called from this thread (the model is up:
    # each call is quick).
    client = httpclient.InferenceServerClient(up.public.removeprefix("http://"))
    try:
        result = client.infer("k_mlp", _inputs(httpclient, x), headers=bearer(full))
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, rtol=1e-4, atol=1e-5)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("k_mlp", _inputs(httpclient, x), headers=bearer(revoked))
        assert refused.value.status() == "401"
        with pytest.raises(InferenceServerException) as out_of_scope:
            client.infer("k_other", _inputs(httpclient, x), headers=bearer(scoped))
        assert out_of_scope.value.status() == "403"
    finally:
        client.close()


async def test_keys_on_grpc_and_a_stream_ended_by_revocation(
    platform: tuple[Platform, str, Path], http: httpx.AsyncClient, tokens: list[str]
) -> None:
    up, address, _ = platform
    model_dir = write_onnx_mlp(up.models_dir, "g_mlp", SIZES, seed=33)
    await register(http, up, model_dir)
    full = await create_key(http, up, tokens)
    scoped = await create_key(http, up, tokens, models=["nothing-*"])
    streaming = await create_key(http, up, tokens, models=["g_*"])
    x = mlp_input(33)
    expected = mlp_reference(load_mlp_weights(model_dir), x)
    client = grpcclient.InferenceServerClient(address)
    try:
        assert client.is_server_live() and client.is_server_ready()
        for headers, code in (
            ({}, "StatusCode.UNAUTHENTICATED"),
            ({"authorization": "Bearer zs_nope"}, "StatusCode.UNAUTHENTICATED"),
            ({"authorization": f"Bearer {scoped}"}, "StatusCode.PERMISSION_DENIED"),
        ):
            with pytest.raises(InferenceServerException) as refused:
                await asyncio.to_thread(
                    client.infer, "g_mlp", _inputs(grpcclient, x), headers=headers
                )
            assert refused.value.status() == code, refused.value
        result = await asyncio.to_thread(
            client.infer,
            "g_mlp",
            _inputs(grpcclient, x),
            headers={"authorization": f"Bearer {full}"},
            client_timeout=WAIT_S,
        )
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, rtol=1e-4, atol=1e-5)

        # A stream opened with a key that is then revoked: its next request ends it.
        results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(
            callback=lambda result, error: results.put((result, error)),
            headers={"authorization": f"Bearer {streaming}"},
        )
        client.async_stream_infer("g_mlp", _inputs(grpcclient, x), request_id="1")
        first, error = await asyncio.to_thread(results.get, timeout=WAIT_S)
        assert error is None, error
        np.testing.assert_allclose(first.as_numpy("OUTPUT0"), expected, rtol=1e-4, atol=1e-5)
        await revoke(http, up, streaming)

        async def refused_over_http() -> bool:
            response = await http.post(
                f"{up.public}/v2/models/g_mlp/infer", json=infer_body(x), headers=bearer(streaming)
            )
            return response.status_code == 401

        await eventually(refused_over_http, "the revocation to reach the activator", up)
        client.async_stream_infer("g_mlp", _inputs(grpcclient, x), request_id="2")
        _, ended = await asyncio.to_thread(results.get, timeout=WAIT_S)
        assert ended is not None and ended.status() == "StatusCode.UNAUTHENTICATED", ended
        client.stop_stream()
        # The server goes on: other keys are served.
        again = await asyncio.to_thread(
            client.infer,
            "g_mlp",
            _inputs(grpcclient, x),
            headers={"authorization": f"Bearer {full}"},
        )
        np.testing.assert_allclose(again.as_numpy("OUTPUT0"), expected, rtol=1e-4, atol=1e-5)
    finally:
        client.close()


async def test_quotas_refuse_with_429_and_resource_exhausted(
    platform: tuple[Platform, str, Path], http: httpx.AsyncClient, tokens: list[str]
) -> None:
    up, address, _ = platform
    model_dir = write_onnx_mlp(up.models_dir, "q_mlp", SIZES, seed=34)
    await register(http, up, model_dir)
    x = mlp_input(34)
    url = f"{up.public}/v2/models/q_mlp/infer"
    # No cold start allowed: the model stays at zero for this key...
    no_starts = await create_key(http, up, tokens, limits={"activations_per_hour": 0})
    response = await http.post(url, json=infer_body(x), headers=bearer(no_starts))
    assert response.status_code == 429, response.text
    assert int(response.headers["retry-after"]) >= 1
    assert "activations" in response.json()["error"]
    assert (await admin_get(http, up, "/models/q_mlp/activations"))["activations"] == []
    # ... until another key's request starts it; then the first key is served.
    starter = await create_key(http, up, tokens, limits={"activations_per_hour": 1})
    assert (await http.post(url, json=infer_body(x), headers=bearer(starter))).status_code == 200
    assert (await http.post(url, json=infer_body(x), headers=bearer(no_starts))).status_code == 200

    # One request in flight: while a model holds the key's request (it answers only once a
    # file exists), the key's next request, to any model, is refused; then both are served.
    gate = up.models_dir / "q_gate_open"
    gated_dir = write_python_model(up.models_dir, "q_gated", source=GATED_MODEL.format(gate=gate))
    await register(http, up, gated_dir)
    single = await create_key(http, up, tokens, limits={"max_in_flight": 1})
    gated_body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [3, 4]}]
    }
    held = asyncio.create_task(
        http.post(f"{up.public}/v2/models/q_gated/infer", json=gated_body, headers=bearer(single))
    )

    async def executing() -> bool:
        return (up.models_dir / "q_gate_waiting").exists()

    await eventually(executing, "the gated model holding a request", up)
    response = await http.post(url, json=infer_body(x), headers=bearer(single))
    assert response.status_code == 429, response.text
    assert "requests in flight" in response.json()["error"]
    gate.touch()
    assert (await held).status_code == 200
    assert (await http.post(url, json=infer_body(x), headers=bearer(single))).status_code == 200

    # One request per ~17 minutes, burst 1: the second is refused, over HTTP and gRPC.
    slow = await create_key(http, up, tokens, limits={"requests_per_s": 0.001, "burst": 1})
    assert (await http.post(url, json=infer_body(x), headers=bearer(slow))).status_code == 200
    response = await http.post(url, json=infer_body(x), headers=bearer(slow))
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) > 60
    client = grpcclient.InferenceServerClient(address)
    try:
        with pytest.raises(InferenceServerException) as exhausted:
            await asyncio.to_thread(
                client.infer,
                "q_mlp",
                _inputs(grpcclient, x),
                headers={"authorization": f"Bearer {slow}"},
            )
        assert exhausted.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    finally:
        client.close()


async def test_openai_client_with_api_key_chat_streaming_and_revocation(
    platform: tuple[Platform, str, Path], http: httpx.AsyncClient, tokens: list[str]
) -> None:
    up, _, _ = platform
    write_tiny_llm(up.models_dir, "k_tiny")
    body = {
        "name": "k_tiny",
        "storage_uri": str(up.models_dir / "k_tiny"),
        "scaling": {"min_replicas": 0, "idle_timeout_s": 600},
    }
    created = await http.post(f"{up.admin}/admin/v1/models", json=body, headers=AUTH)
    assert created.status_code == 201, created.text
    good = await create_key(http, up, tokens, models=["k_tiny"])
    one_at_a_time = await create_key(http, up, tokens, limits={"requests_per_s": 0.001, "burst": 1})
    messages = [{"role": "user", "content": prompt("the", "fox")}]

    def client(token: str) -> Any:
        return openai.AsyncOpenAI(
            base_url=f"{up.public}/v1", api_key=token, max_retries=0, timeout=WAIT_S
        )

    async with client(good) as api:
        chat = await api.chat.completions.create(
            model="k_tiny", messages=messages, max_tokens=6, temperature=0
        )
        assert chat.choices[0].message.content
        assert [m.id for m in (await api.models.list()).data] == ["k_tiny"]
        with pytest.raises(openai.PermissionDeniedError) as denied:
            await api.chat.completions.create(model="k_mlp", messages=messages, max_tokens=2)
        assert denied.value.body["code"] == "permission_denied"

    async with client("zs_000000000000_" + "x" * 43) as api:
        with pytest.raises(openai.AuthenticationError) as unknown:
            await api.chat.completions.create(model="k_tiny", messages=messages, max_tokens=2)
        assert unknown.value.body["code"] == "invalid_api_key"

    # One request per ~17 minutes, burst 1: a stream takes the token, the next request is
    # 429 in OpenAI's shape (the in-flight bound is held deterministically in the quota test,
    # by a model that answers only when told).
    async with client(one_at_a_time) as api:
        stream = await api.chat.completions.create(
            model="k_tiny", messages=messages, max_tokens=24, temperature=0, stream=True
        )
        chunks = [chunk async for chunk in stream]
        assert chunks[-1].choices[0].finish_reason in ("length", "stop")
        with pytest.raises(openai.RateLimitError) as limited:
            await api.chat.completions.create(model="k_tiny", messages=messages, max_tokens=2)
        assert limited.value.body["code"] == "rate_limit_exceeded"

    # Revoked while its stream is open: the stream ends normally, later requests are 401.
    async with client(good) as api:
        stream = await api.chat.completions.create(
            model="k_tiny", messages=messages, max_tokens=24, temperature=0, stream=True
        )
        first = await anext(aiter(stream))
        await revoke(http, up, good)
        rest = [chunk async for chunk in stream]
        assert (first.choices or rest) and rest[-1].choices[0].finish_reason in ("length", "stop")

        async def refused() -> bool:
            try:
                await api.chat.completions.create(model="k_tiny", messages=messages, max_tokens=2)
            except openai.AuthenticationError:
                return True
            return False

        await eventually(refused, "the revoked key to be refused", up)
    assert (await http.get(f"{up.public}/v2/health/ready")).status_code == 200


async def test_no_key_in_any_log_or_metrics(
    platform: tuple[Platform, str, Path], http: httpx.AsyncClient, tokens: list[str]
) -> None:
    """Runs last: every file the platform and its workers wrote, and both metrics pages,
    searched for every key made (and its secret alone)."""
    up, _, folder = platform
    assert tokens, "the tests before made keys"
    secrets = [*tokens, *(t.rsplit("_", 1)[1] for t in tokens)]
    for url in (f"{up.public}/metrics", f"{up.admin}/metrics"):
        page = (await http.get(url)).text
        assert "zeroserve_activator_requests_total" in page or "zeroserve_" in page
        assert not [s for s in secrets if s in page]
    logs = [p for p in folder.rglob("*") if p.is_file() and p.suffix in (".log", ".txt", "")]
    assert logs
    for path in logs:
        text = path.read_text(errors="replace")
        for secret in secrets:
            assert secret not in text, f"a key is in {path}"
