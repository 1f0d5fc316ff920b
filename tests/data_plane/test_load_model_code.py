"""``allow_model_code: false`` on a load refuses a model that is code, whether its config
says so or only its files do; the default serves it, as Triton does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data_plane.server_app import data_plane
from tests.models import write_onnx_mlp, write_python_model

pytestmark = pytest.mark.anyio

MARKER_SOURCE = """\
import pathlib

pathlib.Path({marker!r}).write_text("ran")


class TritonPythonModel:
    def execute(self, inputs):
        return {{"OUTPUT0": inputs["INPUT0"]}}
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    marker = tmp_path / "marker"
    write_python_model(root, "declared", MARKER_SOURCE.format(marker=str(marker)))
    # The same code with a config that names no backend: only its files make it Python.
    undeclared = write_python_model(root, "undeclared", MARKER_SOURCE.format(marker=str(marker)))
    (undeclared / "config.pbtxt").unlink()
    write_onnx_mlp(root, "mlp")
    return root


@pytest.mark.parametrize("name", ["declared", "undeclared"])
async def test_model_code_is_refused_when_the_load_says_so(repo: Path, tmp_path: Path, name: str):
    refuse = {"parameters": {"allow_model_code": False}}
    async with data_plane(repo, tmp_path / "cache") as client:
        response = await client.post(f"/v2/repository/models/{name}/load", json=refuse)
        assert response.status_code == 400, response.text
        assert "is code (python backend)" in response.json()["error"]
        assert not (tmp_path / "marker").exists()  # model.py was never imported
        onnx = await client.post("/v2/repository/models/mlp/load", json=refuse)
        assert onnx.status_code == 200, onnx.text
        allowed = await client.post(f"/v2/repository/models/{name}/load")
        assert allowed.status_code == 200, allowed.text
        assert (tmp_path / "marker").read_text() == "ran"


async def test_allow_model_code_must_be_a_boolean(repo: Path, tmp_path: Path):
    async with data_plane(repo, tmp_path / "cache") as client:
        response = await client.post(
            "/v2/repository/models/mlp/load", json={"parameters": {"allow_model_code": "no"}}
        )
        assert response.status_code == 400
        assert "allow_model_code" in response.json()["error"]
