"""A model loaded by storage URI takes the load's name, whatever its stored config.pbtxt
calls it; in the repository, a folder and its config must agree, as in Triton."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data_plane.server_app import data_plane
from tests.models import write_onnx_mlp

pytestmark = pytest.mark.anyio

ONE_ROW = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}


async def test_a_model_by_uri_is_served_under_the_loads_name(tmp_path: Path):
    store = tmp_path / "store"
    write_onnx_mlp(store, "original")  # its config.pbtxt says name: "original"
    empty = tmp_path / "repo"
    empty.mkdir()
    body = {"parameters": {"storage_uri": str(store / "original")}}
    async with data_plane(empty, tmp_path / "cache", allowed_storage=(str(store),)) as client:
        response = await client.post("/v2/repository/models/renamed/load", json=body)
        assert response.status_code == 200, response.text
        assert (await client.post("/v2/models/renamed/infer", json=ONE_ROW)).status_code == 200
        config = (await client.get("/v2/models/renamed/config")).json()
        assert config["name"] == "renamed"


async def test_a_repository_folder_whose_config_names_another_model_is_refused(tmp_path: Path):
    repo = tmp_path / "repo"
    model_dir = write_onnx_mlp(repo, "original")
    model_dir.rename(repo / "renamed")
    async with data_plane(repo, tmp_path / "cache") as client:
        response = await client.post("/v2/repository/models/renamed/load")
        assert response.status_code == 400
        assert "expecting 'renamed', got 'original'" in response.json()["error"]
