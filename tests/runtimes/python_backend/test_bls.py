"""BLS from Triton Python-backend models, unchanged, through the data plane in process:
Triton's ``bls`` examples (``exec`` from ``execute`` and ``async_exec`` from an ``async def
execute``), a BLS model calling an ONNX model, decoupled BLS calls returning an iterator
(Triton's ``bls_decoupled`` example on ``square_int32``), a model calling itself, and
Triton's texts and codes for calls that fail (an unknown model, inputs that do not fit,
a decoupled model called without ``decoupled=True``). The called model's batcher and
statistics see the calls."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.data_plane.server_app import data_plane
from tests.models import write_onnx_add_sub
from tests.runtimes.python_backend.streaming_models import (
    BLS_ASYNC,
    BLS_ASYNC_CONFIG,
    write_repository,
)

pytestmark = pytest.mark.anyio

MODELS = (
    "add_sub",
    "add_sub_copy",
    "square_int32",
    "bls_sync",
    "bls_async",
    "bls_decoupled_async",
    "bls_decoupled_sync",
    "bls_probe",
    "decoupled_errors",
    "countdown",
)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_repository(tmp_path_factory.mktemp("repo"), MODELS)
    write_onnx_add_sub(root, "add_sub_onnx", dims=(4,), max_batch_size=0)
    folder = root / "bls_onnx"
    (folder / "1").mkdir(parents=True)
    config = BLS_ASYNC_CONFIG.replace("{models}", "add_sub_onnx,add_sub")
    (folder / "config.pbtxt").write_text(config.format(name="bls_onnx"))
    (folder / "1" / "model.py").write_text(BLS_ASYNC)
    return root


@pytest.fixture(scope="module")
async def client(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    names = (*MODELS, "add_sub_onnx", "bls_onnx")
    async with data_plane(repo, tmp_path_factory.mktemp("cache"), load_models=names) as c:
        yield c


def _fp32(name: str, data: list[float]) -> dict[str, object]:
    return {"name": name, "datatype": "FP32", "shape": [4], "data": data}


def _bytes(name: str, text: str) -> dict[str, object]:
    return {"name": name, "datatype": "BYTES", "shape": [1], "data": [text]}


X = [1.0, 2.0, 3.0, 4.0]
SUM_DIFF = [
    {"name": "OUTPUT0", "datatype": "FP32", "shape": [4], "data": [2.0, 4.0, 6.0, 8.0]},
    {"name": "OUTPUT1", "datatype": "FP32", "shape": [4], "data": [0.0, 0.0, 0.0, 0.0]},
]


async def test_sync_bls_calls_add_sub(client: httpx.AsyncClient):
    body = {"inputs": [_bytes("MODEL_NAME", "add_sub"), _fp32("INPUT0", X), _fp32("INPUT1", X)]}
    response = await client.post("/v2/models/bls_sync/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == SUM_DIFF


async def test_async_bls_calls_two_models_at_once(client: httpx.AsyncClient):
    body = {"inputs": [_fp32("INPUT0", X), _fp32("INPUT1", X)]}
    response = await client.post("/v2/models/bls_async/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == SUM_DIFF


async def test_bls_calls_an_onnx_model_through_its_batcher(client: httpx.AsyncClient):
    before = await client.get("/v2/models/add_sub_onnx/stats")
    count = before.json()["model_stats"][0]["inference_count"]
    body = {"inputs": [_fp32("INPUT0", X), _fp32("INPUT1", X)]}
    response = await client.post("/v2/models/bls_onnx/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == SUM_DIFF
    after = await client.get("/v2/models/add_sub_onnx/stats")
    assert after.json()["model_stats"][0]["inference_count"] == count + 1


@pytest.mark.parametrize("model", ["bls_decoupled_async", "bls_decoupled_sync"])
async def test_decoupled_bls_iterates_the_responses(client: httpx.AsyncClient, model: str):
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [3]}]}
    response = await client.post(f"/v2/models/{model}/infer", json=body)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    # Two calls of square_int32(3): three responses of 3 each (the async example sums
    # into numpy's default int64, as it does in Triton).
    expected = 18 if model == "bls_decoupled_async" else 9
    assert output["data"] == [expected]


async def test_a_model_calling_itself_does_not_deadlock(client: httpx.AsyncClient):
    # countdown(4) calls countdown(3), ... countdown(0) on its one instance.
    response = await client.post("/v2/models/countdown/generate", json={"IN": 4})
    assert response.status_code == 200, response.text
    assert response.json() == {"OUT": 10, "model_name": "countdown", "model_version": "1"}


async def test_an_unknown_model_fails_as_in_triton(client: httpx.AsyncClient):
    body = {"inputs": [_bytes("MODEL_NAME", "missing"), _fp32("INPUT0", X), _fp32("INPUT1", X)]}
    response = await client.post("/v2/models/bls_sync/infer", json=body)
    assert response.status_code == 500
    text = response.json()["error"]
    assert text.startswith(
        "Failed to process the request(s) for model 'bls_sync_0_0', message: "
        "TritonModelException: Model missing - Error when running inference: Failed for "
        "execute the inference request. Model 'missing' is not ready.\n\nAt:\n"
    )


def _probe(model: str, name: str, decoupled: bool) -> dict[str, object]:
    return {
        "inputs": [
            _bytes("MODEL_NAME", model),
            _bytes("INPUT_NAME", name),
            {"name": "DECOUPLED", "datatype": "BOOL", "shape": [1], "data": [decoupled]},
        ]
    }


PROBES = [
    pytest.param(
        "missing",
        "INPUT0",
        False,
        "Model missing - Error when running inference: Failed for execute the inference "
        "request. Model 'missing' is not ready.",
        id="unknown-model",
    ),
    pytest.param(
        "add_sub",
        "INPUT0",
        False,
        "Model add_sub - Error when running inference: [request id: <id_unknown>] expected 2 "
        "inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], but missing "
        "required input(s) ['INPUT1']. Please provide all required input(s).",
        id="bad-input",
    ),
    pytest.param(
        "square_int32",
        "INPUT0",
        False,
        "Model square_int32 - Error when running inference: Model square_int32 is using the "
        "decoupled. The current BLS request call doesn't support models using the decoupled "
        "transaction policy. Please use 'decoupled=True' argument to the 'exec' or "
        "'async_exec' calls for decoupled models.'",
        id="decoupled-without-flag",
    ),
    pytest.param(
        "square_int32",
        "IN",
        True,
        "Model square_int32 - Error when running inference: [request id: <id_unknown>] "
        "inference input 'IN' data-type is 'FP32', but model 'square_int32' expects 'INT32'",
        id="wrong-datatype",
    ),
]


@pytest.mark.parametrize(("model", "name", "decoupled", "text"), PROBES)
async def test_failed_calls_read_as_in_triton(
    client: httpx.AsyncClient, model: str, name: str, decoupled: bool, text: str
):
    response = await client.post("/v2/models/bls_probe/infer", json=_probe(model, name, decoupled))
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs == {"ERROR": [text], "CODE": [1], "COUNT": [1]}
