"""The same repository of Triton Python-backend models, served by real Triton 2.51 and by
``zeroserve serve``; the same requests, good and bad, to both: the same statuses, texts
and answers, over HTTP and gRPC. Skips, saying why, where Triton cannot run here.

Known and intended differences, not compared: after a stub crashes Triton keeps the model
READY and fails every later request, zeroserve takes it out of service until it is loaded
again; the ``model_config`` passed to ``initialize`` lacks Triton's filled-in
``optimization`` defaults; over gRPC a response error of code UNKNOWN, ALREADY_EXISTS or
CANCELLED is INVALID_ARGUMENT (HTTP's 400 is the same).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from bench.server import free_port as _free_port
from tests.integration.conftest import ServerProcess, start_server
from tests.runtimes.python_backend.triton_models import MODELS, write_repository
from tests.triton_oracle import TritonServer, triton_for

pytestmark = pytest.mark.integration

STARTUP = [m for m in MODELS if m not in ("init_error", "syntax_error", "crash", "leaky")]


@dataclass(frozen=True)
class Servers:
    triton: TritonServer
    zeroserve: ServerProcess
    zeroserve_grpc: str


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    repo = write_repository(tmp_path_factory.mktemp("repo"), MODELS)
    loads = [arg for name in STARTUP for arg in (f"--load-model={name}",)]
    with triton_for(
        repo, tmp_path_factory.mktemp("triton-log"), "--model-control-mode=explicit", *loads
    ) as triton:
        grpc_port = _free_port()
        zeroserve = start_server(
            repo,
            tmp_path_factory.mktemp("zeroserve-log"),
            "--grpc-port",
            str(grpc_port),
            "--model-control-mode",
            "explicit",
            *(arg for name in STARTUP for arg in ("--load-model", name)),
        )
        try:
            _wait_ready(zeroserve.url)
            yield Servers(triton, zeroserve, f"127.0.0.1:{grpc_port}")
        finally:
            zeroserve.stop()


def _wait_ready(url: str) -> None:
    with httpx.Client(base_url=url, timeout=60.0) as client:
        for model in STARTUP:
            assert client.get(f"/v2/models/{model}/ready").status_code == 200, model


def _post(base: str, path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
    response = httpx.post(base + path, json=body, timeout=60.0)
    return response.status_code, response.json() if response.content else None


def _both(servers: Servers, path: str, body: dict[str, Any] | None = None) -> None:
    """Send the same request to both; the statuses and bodies must be equal."""
    expected = _post(servers.triton.http_url, path, body)
    actual = _post(servers.zeroserve.url, path, body)
    assert actual == expected


def _fp32(name: str, data: list[float], shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": shape, "data": data}


ADD_SUB = [_fp32("INPUT0", [1, 2, 3, 4], [4]), _fp32("INPUT1", [1, 1, 1, 1], [4])]
ONE = [_fp32("INPUT0", [1], [1])]


@pytest.mark.parametrize(
    ("model", "body"),
    [
        pytest.param("add_sub", {"inputs": ADD_SUB}, id="add-sub"),
        pytest.param(
            "add_sub", {"inputs": ADD_SUB, "outputs": [{"name": "OUTPUT1"}]}, id="one-output"
        ),
        pytest.param("partial_outputs", {"inputs": ADD_SUB}, id="model-leaves-one-out"),
        pytest.param(
            "partial_outputs",
            {"inputs": ADD_SUB, "outputs": [{"name": "OUTPUT1"}]},
            id="asked-for-what-it-leaves-out",
        ),
        pytest.param(
            "auto_complete",
            {"inputs": [_fp32("INPUT0", [1] * 8, [2, 4]), _fp32("INPUT1", [2] * 8, [2, 4])]},
            id="auto-complete",
        ),
        pytest.param(
            "batched", {"id": "b1", "inputs": [_fp32("INPUT0", [1, 2], [1, 2])]}, id="batched"
        ),
        pytest.param(
            "strings",
            {
                "inputs": [
                    {"name": "TEXT", "datatype": "BYTES", "shape": [2, 1], "data": ["a", "bb"]}
                ]
            },
            id="strings",
        ),
        pytest.param(
            "request_info",
            {
                "id": "req-7",
                "inputs": ONE,
                "parameters": {"sequence_id": 42, "priority": 0, "z": 1, "a": "\u00fc", "f": 1.5},
                "outputs": [{"name": "PARAMETERS"}, {"name": "ID"}, {"name": "CORRELATION"}],
            },
            id="request-info",
        ),
        pytest.param(
            "request_info",
            {
                "inputs": ONE,
                "parameters": {"sequence_id": "corr"},
                "outputs": [{"name": "REQUESTED"}, {"name": "CORRELATION"}],
            },
            id="string-correlation-id",
        ),
        pytest.param("execute_raises", {"inputs": ONE}, id="execute-raises"),
        pytest.param("wrong_count", {"inputs": ONE}, id="wrong-count"),
        pytest.param("not_a_list", {"inputs": ONE}, id="not-a-list"),
        pytest.param("add_sub", {"inputs": ADD_SUB[:1]}, id="missing-input"),
        pytest.param(
            "add_sub", {"inputs": ADD_SUB, "outputs": [{"name": "NOPE"}]}, id="unknown-output"
        ),
    ],
)
def test_same_answers_over_http(servers: Servers, model: str, body: dict[str, Any]):
    _both(servers, f"/v2/models/{model}/infer", body)


@pytest.mark.parametrize(
    "code",
    [
        "INTERNAL",
        "NOT_FOUND",
        "INVALID_ARG",
        "UNAVAILABLE",
        "UNSUPPORTED",
        "ALREADY_EXISTS",
        "CANCELLED",
        "UNKNOWN",
    ],
)
def test_response_errors_over_http(servers: Servers, code: str):
    body = {
        "id": "e",
        "inputs": [_fp32("INPUT0", [-1, 0], [1, 2])],
        "parameters": {"error_code": code},
    }
    _both(servers, "/v2/models/batched/infer", body)


@pytest.mark.parametrize("model", ["init_error", "syntax_error"])
def test_load_errors(servers: Servers, model: str):
    _both(servers, f"/v2/repository/models/{model}/load")


def test_a_crash_answers_the_same_first(servers: Servers):
    # zeroserve's load answer reports where the files came from; Triton's is empty.
    loads = [
        httpx.post(f"{base}/v2/repository/models/crash/load", timeout=60.0).status_code
        for base in (servers.triton.http_url, servers.zeroserve.url)
    ]
    assert loads == [200, 200]
    _both(servers, "/v2/models/crash/infer", {"inputs": ONE})


def test_auto_completed_configuration(servers: Servers):
    fields = ("max_batch_size", "input", "output", "dynamic_batching")

    def config(base: str) -> dict[str, Any]:
        full = httpx.get(f"{base}/v2/models/auto_complete/config", timeout=60.0).json()
        return {field: full.get(field) for field in fields}

    assert config(servers.zeroserve.url) == config(servers.triton.http_url)


def _grpc_infer(address: str, model: str, inputs: list[tuple[str, np.ndarray]], **kw: Any):
    with grpcclient.InferenceServerClient(address) as client:
        tensors = []
        for name, array in inputs:
            tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        try:
            result = client.infer(model, tensors, **kw)
        except InferenceServerException as exc:
            return ("error", exc.status(), exc.message())
        response = result.get_response()
        return (
            "ok",
            [
                (o.name, o.datatype, list(o.shape), result.as_numpy(o.name).tolist())
                for o in response.outputs
            ],
        )


@pytest.mark.parametrize(
    ("model", "inputs", "parameters"),
    [
        pytest.param(
            "add_sub",
            [("INPUT0", np.arange(4, dtype=np.float32)), ("INPUT1", np.ones(4, np.float32))],
            None,
            id="add-sub",
        ),
        pytest.param("execute_raises", [("INPUT0", np.ones(1, np.float32))], None, id="raises"),
        pytest.param(
            "batched",
            [("INPUT0", -np.ones((1, 2), np.float32))],
            {"error_code": "NOT_FOUND"},
            id="not-found",
        ),
        pytest.param(
            "batched",
            [("INPUT0", -np.ones((1, 2), np.float32))],
            {"error_code": "UNAVAILABLE"},
            id="unavailable",
        ),
        pytest.param(
            "batched",
            [("INPUT0", -np.ones((1, 2), np.float32))],
            {"error_code": "INVALID_ARG"},
            id="invalid-arg",
        ),
    ],
)
def test_same_answers_over_grpc(
    servers: Servers, model: str, inputs: list[tuple[str, np.ndarray]], parameters: Any
):
    kw = {"parameters": parameters, "request_id": "g"} if parameters else {}
    expected = _grpc_infer(servers.triton.grpc_address, model, inputs, **kw)
    actual = _grpc_infer(servers.zeroserve_grpc, model, inputs, **kw)
    assert actual == expected
