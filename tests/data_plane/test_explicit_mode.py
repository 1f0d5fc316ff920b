"""Explicit model control over HTTP, in process: load, unload, reload, failed loads, an
unload draining its requests and probes answered while a model loads.
``tests/integration/test_explicit_mode.py`` keeps what needs a process (SIGTERM)."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from tests.data_plane.server_app import data_plane
from tests.models import write_onnx_mlp, write_python_model

pytestmark = pytest.mark.anyio

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

ONE_ROW = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    write_onnx_mlp(root, "mlp", sizes=(16, 32, 8), max_batch_size=8)
    write_python_model(root, "slow", source=SLOW_MODEL)
    write_python_model(root, "broken", source="raise RuntimeError('this model cannot load')\n")
    return root


async def test_load_unload_cycles(repo: Path, tmp_path: Path):
    async with data_plane(repo, tmp_path / "cache") as client:
        index = (await client.post("/v2/repository/index")).json()
        assert {"name": "mlp"} in index
        response = await client.post("/v2/models/mlp/infer", json=ONE_ROW)
        assert response.status_code == 404
        assert "Request for unknown model: 'mlp' is not found" in response.json()["error"]

        not_json = await client.post("/v2/repository/models/mlp/load", content=b"{nope")
        assert not_json.status_code == 400
        assert "failed to parse the request JSON buffer" in not_json.json()["error"]
        not_object = await client.post("/v2/repository/models/mlp/load", content=b"[1]")
        assert not_object.status_code == 400
        assert not_object.json()["error"] == "the request body must be a JSON object"

        for _ in range(5):
            load = await client.post("/v2/repository/models/mlp/load", content=b"{}")
            assert load.status_code == 200
            assert (await client.get("/v2/models/mlp/ready")).status_code == 200
            assert (await client.post("/v2/models/mlp/infer", json=ONE_ROW)).status_code == 200
            unload = await client.post(
                "/v2/repository/models/mlp/unload",
                json={"parameters": {"unload_dependents": False}},
            )
            assert unload.status_code == 200
            response = await client.post("/v2/models/mlp/infer", json=ONE_ROW)
            assert response.status_code == 404
            assert "has no available versions" in response.json()["error"]
        index = (await client.post("/v2/repository/index")).json()
        assert {
            "name": "mlp",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "unloaded",
        } in index
        assert (await client.post("/v2/repository/index", json={"ready": True})).json() == []


async def test_load_is_idempotent_and_concurrent_loads_join(repo: Path, tmp_path: Path):
    async with data_plane(repo, tmp_path / "cache") as client:
        responses = await asyncio.gather(
            *(client.post("/v2/repository/models/mlp/load") for _ in range(8))
        )
        statuses = [r.status_code for r in responses]
        assert statuses == [200] * 8
        stats = (await client.get("/metrics")).text
        assert 'zeroserve_model_loads_total{model="mlp",outcome="success"} 1.0' in stats


async def test_load_with_config_override(repo: Path, tmp_path: Path):
    config = {
        "backend": "onnxruntime",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "type_fp32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [8]}],
    }
    async with data_plane(repo, tmp_path / "cache") as client:
        response = await client.post(
            "/v2/repository/models/mlp/load", json={"parameters": {"config": json.dumps(config)}}
        )
        assert response.status_code == 200, response.text
        assert (await client.get("/v2/models/mlp/config")).json()["max_batch_size"] == 4
        bad = await client.post(
            "/v2/repository/models/mlp/load", json={"parameters": {"config": '{"nope": 1}'}}
        )
        assert bad.status_code == 400
        assert bad.json()["error"].startswith("failed to load 'mlp', failed to poll from model")
        # The failed reload left the loaded version serving.
        assert (await client.post("/v2/models/mlp/infer", json=ONE_ROW)).status_code == 200
        odd = await client.post("/v2/repository/models/mlp/load", json={"parameters": {"x": 1}})
        assert odd.status_code == 400
        assert "Unrecognized load parameter 'x'" in odd.json()["error"]


async def test_failed_load_says_why_and_leaves_the_model_unloaded(repo: Path, tmp_path: Path):
    async with data_plane(repo, tmp_path / "cache") as client:
        response = await client.post("/v2/repository/models/broken/load")
        assert response.status_code == 400
        assert "this model cannot load" in response.json()["error"]
        missing = await client.post("/v2/repository/models/absent/load")
        assert missing.status_code == 400
        assert "no such file or folder" in missing.json()["error"]
        traversal = await client.post("/v2/repository/models/..%2F..%2Fetc/load")
        assert traversal.status_code in (400, 404)
        rows = (await client.post("/v2/repository/index")).json()
        row = [r for r in rows if r["name"] == "broken"]
        assert row and row[0].get("state") == "UNAVAILABLE"
        assert "this model cannot load" in row[0]["reason"]
        assert (await client.get("/v2/health/live")).status_code == 200


async def test_unload_lets_in_flight_requests_finish(repo: Path, tmp_path: Path):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    async with data_plane(repo, tmp_path / "cache", load_models=("slow",)) as client:
        pending = asyncio.create_task(client.post("/v2/models/slow/infer", json=body))
        # The request is in flight once the model reports it pending or executing.
        await _wait_for_execution(client, "slow")
        unload = await client.post("/v2/repository/models/slow/unload")
        response = await asyncio.wait_for(pending, 60)
    assert unload.status_code == 200
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [2, 4]


async def test_server_answers_probes_while_a_model_loads(tmp_path: Path):
    root = tmp_path / "slowload"
    root.mkdir()
    write_python_model(root, "slowload", source=SLOW_LOADING_MODEL)
    async with data_plane(root, tmp_path / "cache") as client:
        load = asyncio.create_task(client.post("/v2/repository/models/slowload/load"))
        await _wait_for_state(client, "slowload", "LOADING")
        # The load is running; the event loop must still answer.
        live = await asyncio.wait_for(client.get("/v2/health/live"), 5)
        assert live.status_code == 200
        assert not load.done()
        assert (await asyncio.wait_for(load, 60)).status_code == 200


async def _wait_for_execution(client: httpx.AsyncClient, model: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = (await client.get("/metrics")).text
        if f'zeroserve_executing_requests{{model="{model}",version="1"}} 1' in text:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the request never started executing")


async def _wait_for_state(client: httpx.AsyncClient, model: str, state: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = (await client.post("/v2/repository/index")).json()
        if any(r["name"] == model and r.get("state") == state for r in rows):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{model} never reached {state}")
