"""OnnxRuntime's warm engine cache: the second load of a model skips the engine build.

Auto-complete, the other cold-start path (it reads the graph without the weights), is tested
in test_onnx_complete.py."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest

from foundation.proto import model_config_pb2 as mc
from runtimes.base import RuntimeOptions
from runtimes.cache.engines import COMPLETE
from runtimes.cache.pins import PIN_FILENAME, try_exclusive
from runtimes.errors import ModelLoadError
from runtimes.onnx.builder import DISABLE_PREPACKING_PARAMETER
from runtimes.onnx.engine_cache import ENGINE_CACHE_RUNTIME
from runtimes.onnx.runtime import OnnxRuntime
from tests.models import (
    load_mlp_weights,
    load_runtime,
    mlp_reference,
    read_config,
    write_config,
    write_onnx_mlp,
)

SIZES = (32, 256, 128, 8)
"""Weights big enough (> 1 KiB) to go to the external weights file."""


def _engines(cache: Path) -> list[Path]:
    folder = cache / "engines" / ENGINE_CACHE_RUNTIME
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


async def _check_outputs(runtime: OnnxRuntime, model_dir: Path) -> None:
    x = np.random.default_rng(0).standard_normal((3, SIZES[0])).astype(np.float32)
    out = await runtime.infer({"INPUT0": x})
    expected = mlp_reference(load_mlp_weights(model_dir), x)
    np.testing.assert_allclose(out["OUTPUT0"], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.anyio
async def test_second_load_hits_the_engine_cache(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path / "repo", "mlp", SIZES)
    options = RuntimeOptions(cache_dir=tmp_path / "cache")

    first = await load_runtime(OnnxRuntime, model_dir, options=options)
    assert first.engine_cache_hit is False
    await _check_outputs(first, model_dir)
    await first.unload()
    [engine] = _engines(tmp_path / "cache")
    assert {p.name for p in engine.iterdir()} >= {"model.onnx", "model.onnx.data", COMPLETE}
    # The weights live in the external file, not in the graph.
    assert (engine / "model.onnx.data").stat().st_size > (engine / "model.onnx").stat().st_size

    second = await load_runtime(OnnxRuntime, model_dir, options=options)
    try:
        assert second.engine_cache_hit is True
        await _check_outputs(second, model_dir)
    finally:
        await second.unload()
    assert _engines(tmp_path / "cache") == [engine]
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


@pytest.mark.anyio
async def test_without_a_cache_folder_nothing_is_cached(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path / "repo", "mlp", SIZES)
    runtime = await load_runtime(OnnxRuntime, model_dir)
    try:
        assert runtime.engine_cache_hit is None
    finally:
        await runtime.unload()


@pytest.mark.anyio
@pytest.mark.parametrize("value", ["true", "false"])
async def test_prepacking_choice_serves_the_same_numbers(tmp_path: Path, value: str) -> None:
    model_dir = write_onnx_mlp(tmp_path / "repo", "mlp", SIZES)
    config = read_config(model_dir)
    config.parameters[DISABLE_PREPACKING_PARAMETER].string_value = value
    write_config(model_dir, config)
    options = RuntimeOptions(cache_dir=tmp_path / "cache")
    for expected_hit in (False, True):
        runtime = await load_runtime(OnnxRuntime, model_dir, options=options)
        try:
            assert runtime.engine_cache_hit is expected_hit
            await _check_outputs(runtime, model_dir)
        finally:
            await runtime.unload()


@pytest.mark.anyio
async def test_bad_prepacking_value_is_a_load_error(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path / "repo", "mlp", SIZES)
    config = read_config(model_dir)
    config.parameters[DISABLE_PREPACKING_PARAMETER].string_value = "sometimes"
    with pytest.raises(ModelLoadError, match="disable_prepacking must be true or false"):
        await load_runtime(
            OnnxRuntime, model_dir, config=config, options=RuntimeOptions(cache_dir=tmp_path)
        )


@pytest.mark.anyio
async def test_a_changed_model_gets_a_new_engine(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path / "repo", "mlp", SIZES, seed=0)
    options = RuntimeOptions(cache_dir=tmp_path / "cache")
    await (await load_runtime(OnnxRuntime, model_dir, options=options)).unload()

    write_onnx_mlp(tmp_path / "repo", "mlp", SIZES, seed=1)
    model_file = model_dir / "1" / "model.onnx"
    stat = model_file.stat()
    os.utime(model_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # coarse clocks
    runtime = await load_runtime(OnnxRuntime, model_dir, options=options)
    try:
        assert runtime.engine_cache_hit is False
        await _check_outputs(runtime, model_dir)  # the new weights, not the cached ones
    finally:
        await runtime.unload()
    assert len(_engines(tmp_path / "cache")) == 2


@pytest.mark.anyio
async def test_a_damaged_engine_is_rebuilt(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path / "repo", "mlp", SIZES)
    options = RuntimeOptions(cache_dir=tmp_path / "cache")
    await (await load_runtime(OnnxRuntime, model_dir, options=options)).unload()
    [engine] = _engines(tmp_path / "cache")
    weights = engine / "model.onnx.data"
    os.truncate(weights, weights.stat().st_size // 2)

    runtime = await load_runtime(OnnxRuntime, model_dir, options=options)
    try:
        assert runtime.engine_cache_hit is False
        await _check_outputs(runtime, model_dir)
    finally:
        await runtime.unload()
    again = await load_runtime(OnnxRuntime, model_dir, options=options)
    try:
        assert again.engine_cache_hit is True
    finally:
        await again.unload()


@pytest.mark.anyio
async def test_a_loaded_models_engine_is_pinned(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path / "repo", "mlp", SIZES)
    options = RuntimeOptions(cache_dir=tmp_path / "cache")
    runtime = await load_runtime(OnnxRuntime, model_dir, options=options)
    [engine] = _engines(tmp_path / "cache")
    try:
        assert try_exclusive(engine / PIN_FILENAME) is None  # the evictor would skip it
    finally:
        await runtime.unload()
    fd = try_exclusive(engine / PIN_FILENAME)
    assert fd is not None
    os.close(fd)


@pytest.mark.anyio
async def test_concurrent_first_loads_publish_one_engine(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path / "repo", "mlp", SIZES)
    options = RuntimeOptions(cache_dir=tmp_path / "cache")
    config = read_config(model_dir)
    runtimes = [OnnxRuntime(name=f"mlp{i}", version=1, options=options) for i in range(3)]
    await asyncio.gather(*(r.load(model_dir / "1", _copy(config), "cpu") for r in runtimes))
    try:
        for runtime in runtimes:
            await _check_outputs(runtime, model_dir)
    finally:
        for runtime in runtimes:
            await runtime.unload()
    assert len(_engines(tmp_path / "cache")) == 1
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def _copy(config: mc.ModelConfig) -> mc.ModelConfig:
    copy = mc.ModelConfig()
    copy.CopyFrom(config)
    return copy


@pytest.mark.anyio
async def test_an_unusable_cache_folder_does_not_fail_the_load(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path / "repo", "mlp", SIZES)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder should be")
    runtime = await load_runtime(OnnxRuntime, model_dir, options=RuntimeOptions(blocked))
    try:
        assert runtime.engine_cache_hit is None
        await _check_outputs(runtime, model_dir)
    finally:
        await runtime.unload()
