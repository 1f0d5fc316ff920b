"""The repository handlers, called directly: the index, loads with their report and their
parameters, unload, and model control refused where it is not allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_plane.errors import (
    InvalidArgumentError,
    ModelLoadError,
    ModelPollError,
    UnavailableError,
    UnknownModelError,
    UnsupportedError,
)
from data_plane.handlers.repository import LoadOptions, load_options
from data_plane.repository import FetchReport, IndexEntry, VersionState
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


async def test_index_follows_loads_and_unloads(repo: Path, tmp_path: Path):
    async with data_plane_core(repo, tmp_path / "cache") as core:
        handler = core.handlers.repository
        assert await handler.index() == [IndexEntry("broken"), IndexEntry("mlp")]
        assert await handler.index(ready_only=True) == []
        report = await handler.load("mlp")
        assert report == FetchReport(cache="local", bytes_fetched=0, fetch_s=report.fetch_s)
        assert report.fetch_s >= 0
        assert await handler.index(ready_only=True) == [
            IndexEntry("mlp", 1, VersionState.READY, "")
        ]
        await handler.unload("mlp", {"unload_dependents": False})
        assert IndexEntry("mlp", 1, VersionState.UNAVAILABLE, "unloaded") in await handler.index()
        assert await handler.index(ready_only=True) == []


async def test_a_failed_load_says_why_in_the_error_and_the_index(repo: Path, tmp_path: Path):
    async with data_plane_core(repo, tmp_path / "cache") as core:
        handler = core.handlers.repository
        with pytest.raises(ModelLoadError) as raised:
            await handler.load("broken")
        # Triton's words for a version that fails; the index keeps the reason alone.
        assert raised.value.message.startswith(
            "load failed for model 'broken': version 1 is at UNAVAILABLE state: "
        )
        assert raised.value.message.endswith("this model cannot load;\n")
        [row] = [e for e in await handler.index() if e.name == "broken"]
        assert (row.version, row.state) == (1, VersionState.UNAVAILABLE)
        assert row.reason.endswith("this model cannot load")
        assert "UNAVAILABLE state" not in row.reason
        # Triton's words for a model it cannot read, with the reason it only logs.
        with pytest.raises(ModelPollError) as polled:
            await handler.load("absent")
        assert polled.value.message.startswith(
            "failed to load 'absent', failed to poll from model repository: cannot fetch"
        )
        # Unloading a model the server does not know does nothing, as in Triton.
        await handler.unload("absent")


async def test_a_config_override_replaces_the_stored_config(repo: Path, tmp_path: Path):
    config = {
        "backend": "onnxruntime",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [8]}],
    }
    async with data_plane_core(repo, tmp_path / "cache") as core:
        await core.handlers.repository.load("mlp", {"config": json.dumps(config)})
        assert core.handlers.models.config("mlp").max_batch_size == 4


async def test_models_that_cannot_sleep_say_so(repo: Path, tmp_path: Path):
    async with data_plane_core(repo, tmp_path / "cache", load_models=("mlp",)) as core:
        with pytest.raises(UnsupportedError, match="cannot sleep; unload it instead"):
            await core.handlers.repository.sleep("mlp")
        with pytest.raises(UnknownModelError):
            await core.handlers.repository.wake("nope")


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        pytest.param({}, LoadOptions(), id="none"),
        pytest.param(
            {"config": "{}", "storage_uri": "s3://b/m", "allow_model_code": False},
            LoadOptions(config="{}", storage_uri="s3://b/m", allow_model_code=False),
            id="all",
        ),
    ],
)
def test_load_options(parameters: dict[str, object], expected: LoadOptions):
    assert load_options(parameters) == expected


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        pytest.param({"config": 1}, "Invalid config override: expected a JSON string", id="config"),
        pytest.param(
            {"storage_uri": ""}, "Invalid storage_uri: expected a non-empty string", id="uri"
        ),
        pytest.param(
            {"allow_model_code": "yes"},
            "Invalid allow_model_code: expected a boolean",
            id="allow_model_code",
        ),
        pytest.param({"x": 1}, "Unrecognized load parameter 'x' with type 'int'", id="unknown"),
    ],
)
def test_wrong_load_parameters_are_invalid_arguments(parameters: dict[str, object], message: str):
    with pytest.raises(InvalidArgumentError) as raised:
        load_options(parameters)
    assert str(raised.value) == message


async def test_unload_dependents_must_be_a_boolean(repo: Path, tmp_path: Path):
    async with data_plane_core(repo, tmp_path / "cache", load_models=("mlp",)) as core:
        with pytest.raises(InvalidArgumentError, match="'unload_dependents': expected a boolean"):
            await core.handlers.repository.unload("mlp", {"unload_dependents": "no"})
        assert core.handlers.models.ready("mlp")


async def test_model_control_is_refused_outside_explicit_mode(repo: Path, tmp_path: Path):
    async with data_plane_core(repo, tmp_path / "cache", mode=ModelControlMode.NONE) as core:
        handler = core.handlers.repository
        message = "explicit model load / unload is not allowed if polling is enabled"
        for control in (handler.load, handler.unload, handler.sleep, handler.wake):
            with pytest.raises(UnavailableError) as raised:
                await control("mlp")
            assert str(raised.value) == message
        # The index is not model control: it answers in every mode.
        assert IndexEntry("mlp", 1, VersionState.READY, "") in await handler.index()


async def test_a_named_repository_is_refused(repo: Path, tmp_path: Path):
    async with data_plane_core(repo, tmp_path / "cache") as core:
        with pytest.raises(UnsupportedError, match="'repository_name' specification"):
            await core.handlers.repository.load("mlp", repository_name="other")
        assert await core.handlers.repository.index(ready_only=True) == []
