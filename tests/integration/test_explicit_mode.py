"""Explicit model control: load, unload, reload and shutdown of a real server process."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.models import write_onnx_mlp, write_python_model

pytestmark = pytest.mark.integration

SLOW_MODEL = textwrap.dedent(
    """
    import time

    import numpy as np


    class TritonPythonModel:
        def initialize(self, args):
            self.delay_s = 1.5

        def execute(self, inputs):
            time.sleep(self.delay_s)
            return {"OUTPUT0": np.asarray(inputs["INPUT0"]) * 2}
    """
)

ONE_ROW = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    write_onnx_mlp(root, "mlp", sizes=(16, 32, 8), max_batch_size=8)
    write_python_model(root, "slow", source=SLOW_MODEL)
    write_python_model(root, "broken", source="raise RuntimeError('this model cannot load')\n")
    return root


def test_load_unload_cycles(server_factory, repo: Path):
    server = server_factory(repo, "--model-control-mode", "explicit")
    with httpx.Client(base_url=server.url, timeout=60) as client:
        index = client.post("/v2/repository/index").json()
        assert {"name": "mlp"} in index
        response = client.post("/v2/models/mlp/infer", json=ONE_ROW)
        assert response.status_code == 400
        assert "Request for unknown model: 'mlp' is not found" in response.json()["error"]

        not_json = client.post("/v2/repository/models/mlp/load", content=b"{nope")
        assert not_json.status_code == 400
        assert "failed to parse the request JSON buffer" in not_json.json()["error"]
        not_object = client.post("/v2/repository/models/mlp/load", content=b"[1]")
        assert not_object.status_code == 400
        assert not_object.json()["error"] == "the request body must be a JSON object"

        for _ in range(5):
            assert client.post("/v2/repository/models/mlp/load", content=b"{}").status_code == 200
            assert client.get("/v2/models/mlp/ready").status_code == 200
            assert client.post("/v2/models/mlp/infer", json=ONE_ROW).status_code == 200
            unload = client.post(
                "/v2/repository/models/mlp/unload",
                json={"parameters": {"unload_dependents": False}},
            )
            assert unload.status_code == 200
            response = client.post("/v2/models/mlp/infer", json=ONE_ROW)
            assert response.status_code == 404
            assert "has no available versions" in response.json()["error"]
        index = client.post("/v2/repository/index").json()
        assert {
            "name": "mlp",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "unloaded",
        } in index
        assert client.post("/v2/repository/index", json={"ready": True}).json() == []


def test_load_is_idempotent_and_concurrent_loads_join(server_factory, repo: Path):
    server = server_factory(repo, "--model-control-mode", "explicit")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(
            pool.map(
                lambda _: (
                    httpx.post(
                        f"{server.url}/v2/repository/models/mlp/load", timeout=60
                    ).status_code
                ),
                range(8),
            )
        )
    assert statuses == [200] * 8
    stats = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert 'zeroserve_model_loads_total{model="mlp",outcome="success"} 1.0' in stats


def test_load_with_config_override(server_factory, repo: Path):
    server = server_factory(repo, "--model-control-mode", "explicit")
    config = {
        "backend": "onnxruntime",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "type_fp32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [8]}],
    }
    with httpx.Client(base_url=server.url, timeout=60) as client:
        response = client.post(
            "/v2/repository/models/mlp/load", json={"parameters": {"config": json.dumps(config)}}
        )
        assert response.status_code == 200, response.text
        assert client.get("/v2/models/mlp/config").json()["max_batch_size"] == 4
        bad = client.post(
            "/v2/repository/models/mlp/load", json={"parameters": {"config": '{"nope": 1}'}}
        )
        assert bad.status_code == 400
        assert "load failed for model 'mlp'" in bad.json()["error"]
        # The failed reload left the loaded version serving.
        assert client.post("/v2/models/mlp/infer", json=ONE_ROW).status_code == 200
        odd = client.post("/v2/repository/models/mlp/load", json={"parameters": {"x": 1}})
        assert odd.status_code == 400
        assert "Unrecognized load parameter 'x'" in odd.json()["error"]


def test_failed_load_says_why_and_leaves_the_model_unloaded(server_factory, repo: Path):
    server = server_factory(repo, "--model-control-mode", "explicit")
    with httpx.Client(base_url=server.url, timeout=60) as client:
        response = client.post("/v2/repository/models/broken/load")
        assert response.status_code == 400
        assert "this model cannot load" in response.json()["error"]
        missing = client.post("/v2/repository/models/absent/load")
        assert missing.status_code == 400
        assert "no such file or folder" in missing.json()["error"]
        traversal = client.post("/v2/repository/models/..%2F..%2Fetc/load")
        assert traversal.status_code in (400, 404)
        row = [r for r in client.post("/v2/repository/index").json() if r["name"] == "broken"]
        assert row and row[0].get("state") == "UNAVAILABLE"
        assert "this model cannot load" in row[0]["reason"]
        assert client.get("/v2/health/live").status_code == 200


def test_unload_lets_in_flight_requests_finish(server_factory, repo: Path):
    server = server_factory(repo, "--model-control-mode", "explicit", "--load-model", "slow")
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pending = pool.submit(
            httpx.post, f"{server.url}/v2/models/slow/infer", json=body, timeout=60
        )
        # The request is in flight once the model reports it pending or executing.
        _wait_for_execution(server.url, "slow")
        unload = httpx.post(f"{server.url}/v2/repository/models/slow/unload", timeout=60)
        response = pending.result(timeout=60)
    assert unload.status_code == 200
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [2, 4]


def test_sigterm_answers_in_flight_requests_then_exits(server_factory, repo: Path):
    server = server_factory(repo, "--model-control-mode", "explicit", "--load-model", "slow")
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [3, 4]}]}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pending = pool.submit(
            httpx.post, f"{server.url}/v2/models/slow/infer", json=body, timeout=60
        )
        _wait_for_execution(server.url, "slow")
        server.process.send_signal(signal.SIGTERM)
        response = pending.result(timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [6, 8]
    # uvicorn re-raises the signal once its graceful shutdown is over.
    assert server.process.wait(timeout=60) in (0, -signal.SIGTERM)
    assert "unloaded slow" in server.log()


def _wait_for_execution(url: str, model: str) -> None:
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = httpx.get(f"{url}/metrics", timeout=30).text
        if f'zeroserve_executing_requests{{model="{model}",version="1"}} 1' in text:
            return
        time.sleep(0.05)
    raise AssertionError("the request never started executing")


SLOW_LOADING_MODEL = textwrap.dedent(
    """
    import time

    import numpy as np


    class TritonPythonModel:
        def initialize(self, args):
            time.sleep(5)

        def execute(self, inputs):
            return {"OUTPUT0": np.asarray(inputs["INPUT0"]) * 2}
    """
)


def test_server_answers_probes_while_a_model_loads(server_factory, tmp_path: Path):
    root = tmp_path / "slowload"
    root.mkdir()
    write_python_model(root, "slowload", source=SLOW_LOADING_MODEL)
    server = server_factory(root, "--model-control-mode", "explicit")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        load = pool.submit(
            httpx.post, f"{server.url}/v2/repository/models/slowload/load", timeout=60
        )
        _wait_for_state(server.url, "slowload", "LOADING")
        # The load is running; the event loop must still answer.
        assert httpx.get(f"{server.url}/v2/health/live", timeout=5).status_code == 200
        assert not load.done()
        assert load.result(timeout=60).status_code == 200


def _wait_for_state(url: str, model: str, state: str) -> None:
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = httpx.post(f"{url}/v2/repository/index", timeout=30).json()
        if any(r["name"] == model and r.get("state") == state for r in rows):
            return
        time.sleep(0.05)
    raise AssertionError(f"{model} never reached {state}")
