"""OnnxRuntime's cold-start paths: the warm engine cache (the second load of a model skips the
engine build) and auto-complete that reads the graph without the weights."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from foundation.proto import model_config_pb2 as mc
from runtimes.base import RuntimeOptions
from runtimes.cache.engines import COMPLETE
from runtimes.cache.pins import PIN_FILENAME, try_exclusive
from runtimes.errors import ModelLoadError
from runtimes.onnx import (
    DISABLE_PREPACKING_PARAMETER,
    ENGINE_CACHE_RUNTIME,
    OnnxRuntime,
    read_graph_interface,
)
from tests.models import (
    ONNX_ELEM_TYPES,
    load_mlp_weights,
    load_runtime,
    mlp_reference,
    read_config,
    write_config,
    write_onnx_add_sub,
    write_onnx_identity,
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


# ---- auto-complete reads the graph's interface, not its weights ----


def _expected(path: Path) -> tuple[list[bytes], list[bytes], set[str]]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return (
        [v.SerializeToString() for v in graph.input],
        [v.SerializeToString() for v in graph.output],
        {i.name for i in graph.initializer},
    )


def _scanned(path: Path) -> tuple[list[bytes], list[bytes], set[str]]:
    inputs, outputs, initializers = read_graph_interface(path)
    return (
        [v.SerializeToString() for v in inputs],
        [v.SerializeToString() for v in outputs],
        initializers,
    )


def test_graph_interface_matches_onnx_load(tmp_path: Path) -> None:
    paths = [
        write_onnx_mlp(tmp_path, "mlp", SIZES) / "1" / "model.onnx",
        write_onnx_add_sub(tmp_path, "add_sub") / "1" / "model.onnx",
    ]
    for datatype in ONNX_ELEM_TYPES:
        model_dir = write_onnx_identity(tmp_path, f"id_{datatype}", datatype=datatype)
        paths.append(model_dir / "1" / "model.onnx")
    for path in paths:
        assert _scanned(path) == _expected(path), path


def test_graph_interface_of_old_and_external_data_models(tmp_path: Path) -> None:
    weight = onnx.numpy_helper.from_array(np.ones((4, 4), dtype=np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "old",
        # IR < 4: initializers are also graph inputs.
        [
            helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("W", onnx.TensorProto.FLOAT, [4, 4]),
        ],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["n", 4])],
        [weight],
    )
    model = helper.make_model(graph, producer_name="test", doc_string="x" * 300)
    model.ir_version = 3
    old = tmp_path / "old.onnx"
    onnx.save_model(model, str(old))
    external = tmp_path / "external.onnx"
    onnx.save_model(
        model, str(external), save_as_external_data=True, location="w.bin", size_threshold=0
    )
    for path in (old, external):
        assert _scanned(path) == _expected(path)
        assert _scanned(path)[2] == {"W"}
    config = mc.ModelConfig()
    OnnxRuntime.complete_config(tmp_path / "unused", config)  # no file: left to load()
    assert not config.input


def test_unreadable_graph_falls_back_to_onnx_and_fails_clearly(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"\x3a\xff\xff\xff\xff\x0f")  # graph runs past the end
    with pytest.raises(ModelLoadError, match="cannot read model.onnx as ONNX"):
        OnnxRuntime.complete_config(tmp_path, mc.ModelConfig(name="m"))


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
