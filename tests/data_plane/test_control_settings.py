"""The settings poll mode and ``--id`` add, and the server name reaching metadata."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from data_plane.handlers import Handlers
from data_plane.settings import DataPlaneSettings, ModelControlMode
from tests.data_plane.server_app import data_plane_core

pytestmark = pytest.mark.anyio


def test_poll_mode_needs_a_local_repository(tmp_path: Path):
    with pytest.raises(ValidationError, match="poll mode needs a local model repository"):
        DataPlaneSettings(
            model_repository="s3://bucket/models", model_control_mode=ModelControlMode.POLL
        )
    for local in (str(tmp_path), f"file://{tmp_path}"):
        settings = DataPlaneSettings(
            model_repository=local, model_control_mode=ModelControlMode.POLL
        )
        assert settings.model_control_mode is ModelControlMode.POLL
        assert settings.repository_poll_s == 15.0


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"repository_poll_s": 0}, id="poll-interval"),
        pytest.param({"server_id": ""}, id="empty-id"),
        pytest.param({"model_warmup_timeout_s": 0}, id="warmup-timeout"),
    ],
)
def test_bounds(tmp_path: Path, fields: dict[str, object]):
    with pytest.raises(ValidationError):
        DataPlaneSettings(model_repository=str(tmp_path), **fields)  # type: ignore[arg-type]


async def test_the_server_id_names_the_server_in_its_metadata(tmp_path: Path):
    async with data_plane_core(tmp_path, tmp_path / "cache") as core:
        assert core.handlers.server.metadata().name == "triton"
        named = Handlers.create(
            core.repository, core.lifecycle, core.metrics, is_explicit=True, server_id="edge-7"
        )
        try:
            assert named.server.metadata().name == "edge-7"
        finally:
            named.close()
