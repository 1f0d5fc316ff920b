"""The server handlers, called directly: liveness, strict readiness, metadata, metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_plane.handlers.server import EXTENSIONS, ServerMetadata
from data_plane.settings import ModelControlMode
from tests.data_plane.server_app import data_plane_core
from tests.models import write_onnx_mlp, write_python_model

pytestmark = pytest.mark.anyio


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write_onnx_mlp(root, "mlp", sizes=(16, 32, 8))
    write_python_model(root, "broken", source="raise RuntimeError('this model cannot load')\n")
    return root


async def test_live_ready_and_draining(repo: Path, tmp_path: Path):
    async with data_plane_core(repo, tmp_path / "cache", load_models=("mlp",)) as core:
        server = core.handlers.server
        assert server.live() and server.ready()
        core.lifecycle.is_stopping = True
        assert server.live() and not server.ready()


async def test_a_start_up_model_that_failed_keeps_the_server_not_ready(repo: Path, tmp_path: Path):
    async with data_plane_core(repo, tmp_path / "cache", mode=ModelControlMode.NONE) as core:
        # Every model in the repository is a start-up model in mode none; one failed.
        assert core.handlers.server.live()
        assert not core.handlers.server.ready()
    async with data_plane_core(repo, tmp_path / "cache", load_models=("mlp", "broken")) as core:
        assert not core.handlers.server.ready()
        await core.handlers.repository.unload("broken")
        assert core.handlers.server.ready()


async def test_metadata_names_the_server_and_tritons_extensions(repo: Path, tmp_path: Path):
    async with data_plane_core(repo, tmp_path / "cache") as core:
        meta = core.handlers.server.metadata()
    assert meta == ServerMetadata(name="triton", version=meta.version, extensions=EXTENSIONS)
    assert meta.version
    assert {"binary_tensor_data", "model_repository", "statistics"} <= set(meta.extensions)


async def test_metrics_text_has_the_serving_models(repo: Path, tmp_path: Path):
    async with data_plane_core(repo, tmp_path / "cache", load_models=("mlp",)) as core:
        text = core.handlers.server.metrics_text().decode()
    assert 'nv_inference_request_success{model="mlp",version="1"}' in text
    assert 'nv_model_load_duration_secs{model="mlp",version="1"}' in text
