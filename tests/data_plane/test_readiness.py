"""``/v2/health/ready`` means "can serve": failed explicit loads do not take it away, a
start-up model that failed keeps it away (Triton's strict readiness)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from data_plane.settings import ModelControlMode
from tests.data_plane.server_app import data_plane
from tests.models import write_onnx_mlp, write_python_model

pytestmark = pytest.mark.anyio

BROKEN_SOURCE = "raise RuntimeError('this model cannot load')\n"
ONE_ROW = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write_onnx_mlp(root, "mlp", sizes=(16, 32, 8))
    write_python_model(root, "broken", source=BROKEN_SOURCE)
    ensemble = root / "pipeline"
    (ensemble / "1").mkdir(parents=True)
    (ensemble / "config.pbtxt").write_text(
        'name: "pipeline"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'ensemble_scheduling { step { model_name: "mlp" model_version: -1 } }\n'
    )
    return root


async def ready(client: httpx.AsyncClient) -> int:
    return (await client.get("/v2/health/ready")).status_code


async def test_failed_explicit_loads_leave_the_server_ready(repo: Path, tmp_path: Path):
    async with data_plane(repo, tmp_path / "cache", load_models=("mlp",)) as client:
        assert await ready(client) == 200
        broken = await client.post("/v2/repository/models/broken/load")
        assert broken.status_code == 400
        assert "this model cannot load" in broken.json()["error"]
        assert await ready(client) == 200
        refused = await client.post("/v2/repository/models/pipeline/load")
        assert refused.status_code == 400
        assert "ensemble" in refused.json()["error"]
        assert await ready(client) == 200
        bad_config = await client.post(
            "/v2/repository/models/mlp/load",
            json={"parameters": {"config": json.dumps({"max_batch_size": -1})}},
        )
        assert bad_config.status_code == 400
        assert await ready(client) == 200
        # The start-up model still serves: that is what readiness promises.
        assert (await client.post("/v2/models/mlp/infer", json=ONE_ROW)).status_code == 200


async def test_a_start_up_model_that_failed_keeps_the_server_not_ready(repo: Path, tmp_path: Path):
    async with data_plane(repo, tmp_path / "cache", mode=ModelControlMode.NONE) as client:
        # Every model in the repository is a start-up model in mode none; one failed.
        assert (await client.get("/v2/health/live")).status_code == 200
        assert await ready(client) == 400
        assert (await client.post("/v2/models/mlp/infer", json=ONE_ROW)).status_code == 200


async def test_a_start_up_model_unloaded_or_loaded_later_makes_the_server_ready(
    repo: Path, tmp_path: Path
):
    async with data_plane(repo, tmp_path / "cache", load_models=("mlp", "broken")) as client:
        assert await ready(client) == 400
        assert (await client.post("/v2/repository/models/broken/unload")).status_code == 200
        assert await ready(client) == 200
    (repo / "broken" / "1" / "model.py").unlink()
    write_python_model(repo, "broken")
    async with data_plane(repo, tmp_path / "cache", load_models=("mlp", "broken")) as client:
        assert await ready(client) == 200
