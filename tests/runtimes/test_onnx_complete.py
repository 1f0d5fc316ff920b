"""OnnxRuntime's auto-complete: the model configuration completed from the ONNX graph, which
is read without the weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from foundation.proto import model_config_pb2 as mc
from runtimes.errors import ModelLoadError
from runtimes.onnx.complete import DEFAULT_MAX_BATCH_SIZE
from runtimes.onnx.runtime import OnnxRuntime
from runtimes.onnx.wire import read_graph_interface
from tests.models import (
    ONNX_ELEM_TYPES,
    load_runtime,
    write_onnx_add_sub,
    write_onnx_identity,
    write_onnx_mlp,
)

SIZES = (32, 256, 128, 8)
"""Weights big enough (> 1 KiB) to go to the external weights file."""


# --- auto-complete -------------------------------------------------------------------------


def _complete(model_dir: Path, config: mc.ModelConfig | None = None) -> mc.ModelConfig:
    config = config if config is not None else mc.ModelConfig(name=model_dir.name)
    OnnxRuntime.complete_config(model_dir / "1", config)
    return config


def _io(entries) -> list[tuple[str, int, list[int]]]:
    return [(e.name, e.data_type, list(e.dims)) for e in entries]


def test_autocomplete_batching_model_gets_default_batch_and_dynamic_batching(
    tmp_path: Path,
) -> None:
    config = _complete(write_onnx_mlp(tmp_path, "mlp", config=False))

    assert config.max_batch_size == DEFAULT_MAX_BATCH_SIZE == 4
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert _io(config.input) == [("INPUT0", mc.TYPE_FP32, [16])]
    assert _io(config.output) == [("OUTPUT0", mc.TYPE_FP32, [8])]
    assert config.backend == "onnxruntime"


@pytest.mark.anyio
async def test_autocompleted_config_loads_and_serves(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path, "mlp", config=False)
    runtime = await load_runtime(OnnxRuntime, model_dir, config=_complete(model_dir))
    x = np.ones((3, 16), np.float32)
    assert (await runtime.infer({"INPUT0": x}))["OUTPUT0"].shape == (3, 8)
    await runtime.unload()


def test_autocomplete_fixed_first_dim_keeps_dims_without_batching(tmp_path: Path) -> None:
    model_dir = write_onnx_identity(
        tmp_path, "fixed", datatype="INT64", dims=(3, 4), max_batch_size=0, config=False
    )
    config = _complete(model_dir)

    assert config.max_batch_size == 0
    assert config.WhichOneof("scheduling_choice") is None
    assert _io(config.input) == [("INPUT0", mc.TYPE_INT64, [3, 4])]
    assert _io(config.output) == [("OUTPUT0", mc.TYPE_INT64, [3, 4])]


def test_autocomplete_bytes_model_uses_type_string(tmp_path: Path) -> None:
    config = _complete(write_onnx_identity(tmp_path, "s", datatype="BYTES", config=False))
    assert _io(config.input) == [("INPUT0", mc.TYPE_STRING, [-1])]


def test_autocomplete_keeps_user_max_batch_size(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path, "mlp", config=False)
    config = _complete(model_dir, mc.ModelConfig(name="mlp", max_batch_size=16))

    assert config.max_batch_size == 16
    assert config.WhichOneof("scheduling_choice") is None
    assert _io(config.input) == [("INPUT0", mc.TYPE_FP32, [16])]


def test_autocomplete_full_rank_dims_mean_no_batching(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path, "mlp", config=False)
    user = mc.ModelConfig(name="mlp", backend="onnxruntime")
    user.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[-1, 16])
    config = _complete(model_dir, user)

    assert config.max_batch_size == 0
    assert _io(config.input) == [("INPUT0", mc.TYPE_FP32, [-1, 16])]
    assert _io(config.output) == [("OUTPUT0", mc.TYPE_FP32, [-1, 8])]


def test_autocomplete_keeps_user_scheduler_and_fields(tmp_path: Path) -> None:
    model_dir = write_onnx_add_sub(tmp_path, "simple", config=False)
    user = mc.ModelConfig(name="simple", platform="onnxruntime_onnx")
    user.sequence_batching.max_sequence_idle_microseconds = 5
    user.output.add(name="OUTPUT1", dims=[16])
    config = _complete(model_dir, user)

    assert config.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    assert config.WhichOneof("scheduling_choice") == "sequence_batching"
    assert config.sequence_batching.max_sequence_idle_microseconds == 5
    assert config.platform == "onnxruntime_onnx"
    assert config.backend == ""
    # The user's output keeps its place and gains only the datatype it lacked.
    assert _io(config.output) == [
        ("OUTPUT1", mc.TYPE_FP32, [16]),
        ("OUTPUT0", mc.TYPE_FP32, [16]),
    ]
    assert [e.name for e in config.input] == ["INPUT0", "INPUT1"]


def test_autocomplete_without_model_file_changes_nothing(tmp_path: Path) -> None:
    config = mc.ModelConfig(name="empty")
    OnnxRuntime.complete_config(tmp_path, config)
    assert config == mc.ModelConfig(name="empty")


def test_autocomplete_corrupt_file_raises_load_error(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"\x00garbage")
    with pytest.raises(ModelLoadError, match="model.onnx"):
        OnnxRuntime.complete_config(tmp_path, mc.ModelConfig(name="bad"))


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
