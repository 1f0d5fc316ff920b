"""The per-model handlers, called directly: metadata, readiness, config and statistics of
real ONNX models."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from data_plane.errors import (
    InvalidArgumentError,
    ModelNotReadyError,
    NotFoundError,
    UnknownModelError,
)
from data_plane.handlers.models import ModelMetadata, TensorMetadata
from data_plane.protocol import decode_infer_request
from foundation.proto.model_config_pb2 import ModelInstanceGroup
from tests.data_plane.server_app import Core, data_plane_core
from tests.models import write_onnx_add_sub, write_onnx_mlp

pytestmark = pytest.mark.anyio

ONE_ROW = b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": %s}]}'


@pytest.fixture
async def core(tmp_path: Path) -> AsyncIterator[Core]:
    root = tmp_path / "repo"
    write_onnx_mlp(root, "mlp", sizes=(16, 32, 8), max_batch_size=32)
    write_onnx_mlp(root, "flat", sizes=(4, 8, 2), max_batch_size=0)
    write_onnx_add_sub(root, "simple", dtype="INT32", dims=(16,), max_batch_size=8)
    write_onnx_mlp(root, "autoconfig", sizes=(4, 8, 2), config=False)
    models = ("mlp", "flat", "simple", "autoconfig")
    async with data_plane_core(root, tmp_path / "cache", load_models=models) as core:
        yield core


async def _infer_one_row(core: Core) -> None:
    model = core.handlers.infer.model("mlp")
    body = ONE_ROW % str([0.5] * 16).encode()
    request = decode_infer_request(body, header_length=None, model="mlp", max_input_bytes=2**20)
    await core.handlers.infer.infer(model, request)


async def test_metadata_shows_the_batch_dimension_only_when_batching(core: Core):
    models = core.handlers.models
    mlp = models.metadata("mlp")
    assert mlp == ModelMetadata(
        name="mlp",
        versions=("1",),
        platform=mlp.platform,
        inputs=(TensorMetadata("INPUT0", "FP32", (-1, 16)),),
        outputs=(TensorMetadata("OUTPUT0", "FP32", (-1, 8)),),
    )
    assert mlp.platform in ("onnxruntime", "onnxruntime_onnx")
    assert models.metadata("mlp", 1) == mlp
    # Without batching the shape is the configured dims alone (here a variable first one).
    assert models.metadata("flat").inputs == (TensorMetadata("INPUT0", "FP32", (-1, 4)),)
    simple = models.metadata("simple")
    assert [t.name for t in simple.inputs] == ["INPUT0", "INPUT1"]
    assert {t.datatype for t in (*simple.inputs, *simple.outputs)} == {"INT32"}


@pytest.mark.parametrize(
    ("name", "version", "error", "message"),
    [
        pytest.param(
            "nope",
            None,
            UnknownModelError,
            "Request for unknown model: 'nope' is not found",
            id="unknown-model",
        ),
        pytest.param(
            "mlp",
            9,
            NotFoundError,
            "Request for unknown model: 'mlp' version 9 is not found",
            id="unknown-version",
        ),
    ],
)
async def test_lookups_of_what_is_not_there_raise(
    core: Core, name: str, version: int | None, error: type[Exception], message: str
):
    models = core.handlers.models
    for lookup in (models.metadata, models.config):
        with pytest.raises(error) as raised:
            lookup(name, version)
        assert str(raised.value) == message
    # Readiness answers instead of raising: "not ready", as Triton does.
    assert not models.ready(name, version)


async def test_ready_is_false_for_a_version_that_is_not_serving(core: Core):
    models = core.handlers.models
    assert models.ready("mlp") and models.ready("mlp", 1)
    await core.handlers.repository.unload("mlp")
    assert not models.ready("mlp", 1)
    with pytest.raises(ModelNotReadyError):
        models.metadata("mlp", 1)
    assert not models.ready("mlp")
    with pytest.raises(NotFoundError, match="has no available versions"):
        models.metadata("mlp")


async def test_config_is_complete(core: Core):
    config = core.handlers.models.config("mlp")
    assert config.name == "mlp" and config.max_batch_size == 32
    assert list(config.input[0].dims) == [16]
    assert config.instance_group[0].kind == ModelInstanceGroup.KIND_CPU
    # No config.pbtxt: the ONNX Runtime backend's default on CPU, two instances, as Triton.
    group = core.handlers.models.config("autoconfig").instance_group[0]
    assert (group.kind, group.count) == (ModelInstanceGroup.KIND_CPU, 2)


async def test_stats_count_requests_per_version(core: Core):
    models = core.handlers.models
    [before] = models.stats("mlp")
    assert (before.name, before.version, before.stats.inference_count) == ("mlp", 1, 0)
    await _infer_one_row(core)
    await _infer_one_row(core)
    [after] = models.stats("mlp", 1)
    assert after.stats.inference_count == 2 and after.stats.success.count == 2
    assert after.stats.execution_count >= 1
    assert {s.name for s in models.stats()} == {"mlp", "flat", "simple", "autoconfig"}


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        pytest.param("nope", None, "requested model 'nope' is not available", id="unknown"),
        pytest.param(
            "mlp", 9, "requested model version is not available for model 'mlp'", id="version"
        ),
    ],
)
async def test_stats_of_what_is_not_there_are_invalid_arguments(
    core: Core, name: str, version: int | None, message: str
):
    with pytest.raises(InvalidArgumentError) as raised:
        core.handlers.models.stats(name, version)
    assert str(raised.value) == message


async def test_stats_of_an_unloaded_model_are_an_invalid_argument(core: Core):
    await core.handlers.repository.unload("mlp")
    with pytest.raises(InvalidArgumentError, match="requested model 'mlp' is not available"):
        core.handlers.models.stats("mlp")
