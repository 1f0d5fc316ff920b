"""Triton Python-backend models, unchanged, through the data plane's HTTP API in process:
the dynamic batcher handing ``execute`` a list of requests, per-request errors with
Triton's statuses, a crashing model taken out of service and loaded again, and a model
holding the GIL while another serves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.data_plane.server_app import data_plane
from tests.models import write_python_model
from tests.runtimes.python_backend.triton_models import write_repository

pytestmark = pytest.mark.anyio

MODELS = (
    "add_sub",
    "batched",
    "auto_complete",
    "execute_raises",
    "crash",
    "gil_hog",
    "init_error",
    "request_info",
    "strings",
    "partial_outputs",
)
STARTUP = tuple(m for m in MODELS if m != "init_error")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("repo"), MODELS)


@pytest.fixture(scope="module")
async def client(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    """One server for the module: starting every model's stubs once."""
    async with data_plane(repo, tmp_path_factory.mktemp("cache"), load_models=STARTUP) as c:
        yield c


def _fp32(name: str, data: list[float], shape: list[int]) -> dict[str, object]:
    return {"name": name, "datatype": "FP32", "shape": shape, "data": data}


ADD_SUB_INPUTS = [_fp32("INPUT0", [1, 2, 3, 4], [4]), _fp32("INPUT1", [1, 1, 1, 1], [4])]


async def test_add_sub_as_tritons_example(client: httpx.AsyncClient):
    response = await client.post("/v2/models/add_sub/infer", json={"inputs": ADD_SUB_INPUTS})
    assert response.status_code == 200
    assert response.json()["outputs"] == [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [4], "data": [2.0, 3.0, 4.0, 5.0]},
        {"name": "OUTPUT1", "datatype": "FP32", "shape": [4], "data": [0.0, 1.0, 2.0, 3.0]},
    ]
    body = {"inputs": ADD_SUB_INPUTS, "outputs": [{"name": "OUTPUT1"}]}
    only = await client.post("/v2/models/add_sub/infer", json=body)
    assert [o["name"] for o in only.json()["outputs"]] == ["OUTPUT1"]


async def test_outputs_the_model_leaves_out_are_left_out(client: httpx.AsyncClient):
    body = {"inputs": ADD_SUB_INPUTS}
    response = await client.post("/v2/models/partial_outputs/infer", json=body)
    assert [o["name"] for o in response.json()["outputs"]] == ["OUTPUT0"]
    body["outputs"] = [{"name": "OUTPUT1"}]
    response = await client.post("/v2/models/partial_outputs/infer", json=body)
    assert response.status_code == 200
    assert response.json()["outputs"] == []


async def test_batcher_hands_execute_several_requests_and_errors_stay_per_request(
    client: httpx.AsyncClient,
):
    async def infer(value: float, request_id: str) -> httpx.Response:
        body = {
            "id": request_id,
            "inputs": [_fp32("INPUT0", [value, 1], [1, 2])],
            "parameters": {"error_code": "NOT_FOUND"},
        }
        return await client.post("/v2/models/batched/infer", json=body)

    responses = await asyncio.gather(*(infer(v, f"r{i}") for i, v in enumerate([1, -1, 2, 3])))
    ok = [r for i, r in enumerate(responses) if i != 1]
    assert [r.status_code for r in ok] == [200, 200, 200]
    assert [r.json()["outputs"][0]["data"] for r in ok] == [[2, 2], [4, 2], [6, 2]]
    # The queue delay (300 ms) lets the requests meet: one execute got several of them.
    assert max(r.json()["outputs"][1]["data"][0] for r in ok) > 1
    assert responses[1].status_code == 404
    assert responses[1].json() == {"error": "negative input in request r1"}


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("INTERNAL", 500),
        ("NOT_FOUND", 404),
        ("INVALID_ARG", 400),
        ("UNAVAILABLE", 503),
        ("UNSUPPORTED", 501),
        ("ALREADY_EXISTS", 400),
        ("CANCELLED", 400),
        ("UNKNOWN", 400),
    ],
)
async def test_response_error_codes_give_tritons_statuses(
    client: httpx.AsyncClient, code: str, status: int
):
    body = {
        "id": "e",
        "inputs": [_fp32("INPUT0", [-1, 0], [1, 2])],
        "parameters": {"error_code": code},
    }
    response = await client.post("/v2/models/batched/infer", json=body)
    assert response.status_code == status
    assert response.json() == {"error": "negative input in request e"}


async def test_an_exception_from_execute_is_a_500_with_tritons_text(client: httpx.AsyncClient):
    body = {"inputs": [_fp32("INPUT0", [1], [1])]}
    response = await client.post("/v2/models/execute_raises/infer", json=body)
    assert response.status_code == 500
    assert response.json()["error"].startswith(
        "Failed to process the request(s) for model 'execute_raises_0_0', message: "
        "ValueError: this model cannot execute\n\nAt:\n  "
    )
    assert response.json()["error"].endswith("/execute_raises/1/model.py(7): execute\n")


async def test_a_load_error_reads_as_tritons(client: httpx.AsyncClient):
    response = await client.post("/v2/repository/models/init_error/load")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error.startswith(
        "load failed for model 'init_error': version 1 is at UNAVAILABLE state: Internal: "
        "RuntimeError: cannot initialize init_error\n\nAt:\n  "
    )
    assert error.endswith("/init_error/1/model.py(7): initialize\n;\n")


async def test_a_crash_fails_in_flight_requests_and_the_model_can_be_loaded_again(
    client: httpx.AsyncClient,
):
    body = {"inputs": [_fp32("INPUT0", [1], [1])]}
    response = await client.post("/v2/models/crash/infer", json=body)
    assert response.status_code == 500
    assert response.json() == {"error": "Stub process 'crash_0_0' is not healthy."}
    for _ in range(200):
        if (await client.get("/v2/models/crash/ready")).status_code != 200:
            break
        await asyncio.sleep(0.05)
    not_ready = await client.get("/v2/models/crash/ready")
    assert not_ready.status_code != 200
    index = (await client.post("/v2/repository/index", json={})).json()
    assert {
        "name": "crash",
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": "Stub process 'crash_0_0' is not healthy.",
    } in index
    # The rest of the server is unaffected.
    add = await client.post("/v2/models/add_sub/infer", json={"inputs": ADD_SUB_INPUTS})
    assert add.status_code == 200
    assert (await client.post("/v2/repository/models/crash/load")).status_code == 200
    assert (await client.get("/v2/models/crash/ready")).status_code == 200


async def test_a_model_holding_the_gil_does_not_stall_others(client: httpx.AsyncClient):
    finished: list[str] = []

    async def hog() -> httpx.Response:
        body = {"inputs": [_fp32("INPUT0", [3.0], [1])]}
        response = await client.post("/v2/models/gil_hog/infer", json=body)
        finished.append("gil_hog")
        return response

    async def add() -> httpx.Response:
        response = await client.post("/v2/models/add_sub/infer", json={"inputs": ADD_SUB_INPUTS})
        finished.append("add_sub")
        return response

    hogging = asyncio.create_task(hog())
    adds = [await add() for _ in range(20)]
    assert (await hogging).status_code == 200
    assert all(r.status_code == 200 for r in adds)
    # All twenty answers came while the other model spun in its own process.
    assert finished == ["add_sub"] * 20 + ["gil_hog"]


async def test_request_parameters_reach_the_model_as_tritons_do(client: httpx.AsyncClient):
    body = {
        "id": "req-7",
        "inputs": [_fp32("INPUT0", [1], [1])],
        "parameters": {"sequence_id": 42, "priority": 0, "custom": "x", "flag": True},
        "outputs": [{"name": "PARAMETERS"}, {"name": "CORRELATION"}, {"name": "ID"}],
    }
    response = await client.post("/v2/models/request_info/infer", json=body)
    outputs = {o["name"]: o["data"][0] for o in response.json()["outputs"]}
    assert outputs == {
        "ID": "req-7",
        "CORRELATION": "42",
        "PARAMETERS": '{"custom":"x","flag":true}',
    }
    assert [o["name"] for o in response.json()["outputs"]] == ["ID", "CORRELATION", "PARAMETERS"]


async def test_strings_and_auto_complete(client: httpx.AsyncClient):
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 2], "data": ["ab", "c"]}]}
    response = await client.post("/v2/models/strings/infer", json=body)
    assert response.json()["outputs"] == [
        {"name": "UPPER", "datatype": "BYTES", "shape": [1, 2], "data": ["AB", "C"]},
        {"name": "LENGTHS", "datatype": "INT64", "shape": [1, 2], "data": [2, 1]},
    ]
    config = (await client.get("/v2/models/auto_complete/config")).json()
    assert config["max_batch_size"] == 4
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]


async def test_a_dict_contract_model_beside_triton_models(client: httpx.AsyncClient, repo: Path):
    write_python_model(repo, "pydouble")
    assert (await client.post("/v2/repository/models/pydouble/load")).status_code == 200
    body = {"inputs": [_fp32("INPUT0", [1.5, 2], [1, 2])]}
    response = await client.post("/v2/models/pydouble/infer", json=body)
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == [3.0, 4.0]
