"""Model files stay inside the model's folder: a config's file name or a symlinked version
folder must not make a worker import or open a file outside the allowed storage roots, and
files zeroserve does not load (custom op libraries, Python environments) are refused, not
silently ignored.

Each test loads through the data plane's HTTP API, in process, with the real repository,
node cache and runtimes.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.data_plane.llm_app import llm_app
from tests.models import marker_model_source, write_onnx_mlp, write_python_model

pytestmark = pytest.mark.anyio


async def _load(client: httpx.AsyncClient, name: str, config: str | None = None) -> httpx.Response:
    body = {"parameters": {"config": config}} if config is not None else {}
    return await client.post(f"/v2/repository/models/{name}/load", json=body)


def _outside_python_model(tmp_path: Path) -> tuple[Path, Path]:
    """``outside/evil.py`` (outside the repository) and the marker it writes when imported."""
    marker = tmp_path / "marker"
    evil = tmp_path / "outside" / "evil.py"
    evil.parent.mkdir()
    evil.write_text(marker_model_source(marker))
    return evil, marker


@pytest.mark.parametrize("spelling", ["absolute", "dot-dot"])
async def test_config_pbtxt_cannot_name_a_model_py_outside(tmp_path: Path, spelling: str) -> None:
    evil, marker = _outside_python_model(tmp_path)
    repo = tmp_path / "repo"
    model_dir = write_python_model(repo, "m")
    # Its own version folder holds something, as a real model folder would.
    (model_dir / "1" / "model.py").rename(model_dir / "1" / "unused.py")
    filename = str(evil) if spelling == "absolute" else "../../../outside/evil.py"
    with (model_dir / "config.pbtxt").open("a") as config:
        config.write(f"default_model_filename: {json.dumps(filename)}\n")

    async with llm_app(repo, tmp_path / "cache", models=()) as server:
        response = await _load(server.client, "m")

        assert response.status_code == 400
        assert "'default_model_filename' must be the name of a file" in response.json()["error"]
        assert (await server.client.get("/v2/models/m/ready")).status_code != 200
    assert not marker.exists()


async def test_the_load_apis_config_cannot_name_a_model_py_outside(tmp_path: Path) -> None:
    evil, marker = _outside_python_model(tmp_path)
    repo = tmp_path / "repo"
    write_python_model(repo, "m")
    config = json.dumps({"backend": "python", "default_model_filename": str(evil)})

    async with llm_app(repo, tmp_path / "cache", models=()) as server:
        response = await _load(server.client, "m", config)

        assert response.status_code == 400
        assert "'default_model_filename' must be the name of a file" in response.json()["error"]
    assert not marker.exists()


async def test_config_cannot_name_an_onnx_file_outside(tmp_path: Path) -> None:
    outside = write_onnx_mlp(tmp_path / "outside", "o") / "1" / "model.onnx"
    repo = tmp_path / "repo"
    model_dir = write_onnx_mlp(repo, "m")
    (model_dir / "1" / "model.onnx").rename(model_dir / "1" / "unused.onnx")
    with (model_dir / "config.pbtxt").open("a") as config_file:
        config_file.write('default_model_filename: "../../../outside/o/1/model.onnx"\n')
    config = json.dumps({"backend": "onnxruntime", "default_model_filename": str(outside)})

    async with llm_app(repo, tmp_path / "cache", models=()) as server:
        for response in (await _load(server.client, "m", config), await _load(server.client, "m")):
            assert response.status_code == 400
            assert "'default_model_filename' must be the name of a file" in response.json()["error"]
        infer = await server.client.post(
            "/v2/models/m/infer",
            json={
                "inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}
                ]
            },
        )
        assert infer.status_code != 200


async def test_a_version_folder_linked_outside_the_repository_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    outside = tmp_path / "outside"
    (outside / "py" / "1").mkdir(parents=True)
    (outside / "py" / "1" / "model.py").write_text(marker_model_source(marker))
    write_onnx_mlp(outside, "onnx")
    repo = tmp_path / "repo"
    python_dir = write_python_model(repo, "py", version=7)
    onnx_dir = write_onnx_mlp(repo, "onnx", version=7)
    for model_dir in (python_dir, onnx_dir):
        # The outside version (1) is older than the repository's own (7): a policy that
        # loads every version reaches it.
        with (model_dir / "config.pbtxt").open("a") as config:
            config.write("version_policy { all {} }\n")
        (model_dir / "1").symlink_to(outside / model_dir.name / "1", target_is_directory=True)

    async with llm_app(repo, tmp_path / "cache", models=()) as server:
        for name in ("py", "onnx"):
            response = await _load(server.client, name)

            assert response.status_code == 400, response.text
            assert "outside the allowed root" in response.json()["error"]
            assert (await server.client.get(f"/v2/models/{name}/versions/1/ready")).is_error
    assert not marker.exists()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param(
            {"model_operations": {"op_library_filename": ["libcustom.so"]}},
            "'model_operations.op_library_filename' is not supported",
            id="op-library",
        ),
        pytest.param(
            {"parameters": {"EXECUTION_ENV_PATH": {"string_value": "/usr"}}},
            "EXECUTION_ENV_PATH /usr resolves to /usr, outside the model's folder",
            id="execution-env-outside",
        ),
    ],
)
async def test_files_zeroserve_does_not_load_are_refused_at_load(
    tmp_path: Path, fields: dict[str, object], message: str
) -> None:
    repo = tmp_path / "repo"
    write_python_model(repo, "m")
    config = json.dumps({"backend": "python", **fields})

    async with llm_app(repo, tmp_path / "cache", models=()) as server:
        response = await _load(server.client, "m", config)

        assert response.status_code == 400
        assert message in response.json()["error"]
        assert (await server.client.get("/v2/models/m/ready")).status_code != 200
