"""Which providers a GPU ONNX model gets, and their options: pure functions, tested here
without a GPU. Where a test needs ORT to list the CUDA or TensorRT provider, which the CPU
wheel installed here lacks, it says so and patches the list."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import onnxruntime as ort
import pytest

from foundation.proto import model_config_pb2 as mc
from runtimes.base import RuntimeOptions
from runtimes.errors import ModelLoadError
from runtimes.onnx import builder as builder_module, engine_cache
from runtimes.onnx.builder import SessionBuilder
from runtimes.onnx.providers import (
    CPU,
    CUDA,
    TENSORRT,
    choose_providers,
    cuda_options,
    probe_tensorrt,
    profile_shapes,
)

_ALL = (TENSORRT, CUDA, CPU)
GIB = 2**30


def _batched(*inputs: tuple[str, list[int]], preferred: tuple[int, ...] = ()) -> mc.ModelConfig:
    config = mc.ModelConfig(name="m", max_batch_size=16)
    for name, dims in inputs:
        config.input.add(name=name, data_type=mc.TYPE_FP32, dims=dims)
    if preferred:
        config.dynamic_batching.preferred_batch_size.extend(preferred)
    return config


def test_tensorrt_is_chosen_only_where_it_loads(tmp_path: Path):
    config = _batched(("x", [3]))
    without = choose_providers(
        device_id="1", available=_ALL, tensorrt=None, config=config, memory_bytes=0, trt_cache=None
    )
    assert [name for name, _ in without] == [CUDA, CPU]
    assert without[0][1] == {"device_id": "1"}
    trt_cache = tmp_path / "trt"
    with_trt = choose_providers(
        device_id="1",
        available=_ALL,
        tensorrt="100300",
        config=config,
        memory_bytes=0,
        trt_cache=trt_cache,
    )
    assert [name for name, _ in with_trt] == [TENSORRT, CUDA, CPU]
    options = with_trt[0][1]
    assert options["trt_timing_cache_enable"] == "True"
    assert options["trt_timing_cache_path"] == str(trt_cache)
    assert options["trt_engine_cache_path"] == str(trt_cache)
    assert trt_cache.is_dir()
    assert options["trt_profile_max_shapes"] == "x:16x3"


def test_the_cuda_arena_is_bounded_by_the_budget():
    assert cuda_options("0", 2 * GIB) == {
        "device_id": "0",
        "gpu_mem_limit": str(2 * GIB),
        "arena_extend_strategy": "kSameAsRequested",
    }
    assert cuda_options("0", 0) == {"device_id": "0"}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            _batched(("a", [3, 4]), ("b", [2]), preferred=(4, 8)),
            {
                "trt_profile_min_shapes": "a:1x3x4,b:1x2",
                "trt_profile_opt_shapes": "a:8x3x4,b:8x2",
                "trt_profile_max_shapes": "a:16x3x4,b:16x2",
            },
        ),
        (
            _batched(("a", [5])),  # no preferred size: the largest batch is the one to tune
            {
                "trt_profile_min_shapes": "a:1x5",
                "trt_profile_opt_shapes": "a:16x5",
                "trt_profile_max_shapes": "a:16x5",
            },
        ),
        (_batched(("a", [-1, 4])), {}),  # a variable dim has no bounds to give
        (mc.ModelConfig(name="m", max_batch_size=0, input=[mc.ModelInput(name="a", dims=[3])]), {}),
    ],
    ids=["preferred", "largest", "variable", "unbatched"],
)
def test_profiles_span_the_batch_sizes(config: mc.ModelConfig, expected: dict[str, str]):
    assert profile_shapes(config) == expected


def test_profiles_use_the_reshape_and_the_sequence_controls():
    config = _batched(("a", [12]))
    config.input[0].reshape.shape.extend([3, 4])
    control = config.sequence_batching.control_input.add(name="START")
    control.control.add(
        kind=mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START,
        int32_false_true=[0, 1],
        data_type=mc.TYPE_INT32,
    )
    assert profile_shapes(config)["trt_profile_max_shapes"] == "a:16x3x4,START:16x1"


def test_the_probe_needs_orts_library_and_libnvinfer(tmp_path: Path):
    library = tmp_path / "libonnxruntime_providers_tensorrt.so"

    def loads(name: str) -> SimpleNamespace:
        if name != "libnvinfer.so.10":
            raise OSError(f"{name}: cannot open shared object file")
        return SimpleNamespace(getInferLibVersion=lambda: 100300)

    assert probe_tensorrt(load=loads, candidates=["libnvinfer.so.10"], ort_library=library) is None
    library.touch()
    found = probe_tensorrt(
        load=loads, candidates=["libnvinfer.so.8", "libnvinfer.so.10"], ort_library=library
    )
    assert found == "100300"
    assert probe_tensorrt(load=loads, candidates=["libnvinfer.so.8"], ort_library=library) is None


def test_the_real_probe_finds_no_tensorrt_here():
    """The CPU onnxruntime wheel installed here has no TensorRT provider library."""
    if TENSORRT in ort.get_available_providers():
        pytest.skip("this onnxruntime has TensorRT: the probe's answer depends on the image")
    assert probe_tensorrt() is None


def _builder(config: mc.ModelConfig) -> SessionBuilder:
    return SessionBuilder("m", config, RuntimeOptions(), weight_bytes=0)


def test_the_builder_takes_the_budget_and_the_engine_key_the_tensorrt_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """ORT's CPU wheel lists neither CUDA nor TensorRT: the provider list and the probe are
    patched to those of a GPU image with TensorRT 10.3."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: list(_ALL))
    monkeypatch.setattr(builder_module, "tensorrt_version", lambda: "100300")
    monkeypatch.setattr(engine_cache, "tensorrt_version", lambda: "100300")
    config = _batched(("x", [3]))
    config.parameters["memory_bytes"].string_value = str(GIB)
    builder = _builder(config)
    providers = dict(builder.providers("cuda:0", trt_cache=None))
    assert providers[CUDA]["gpu_mem_limit"] == str(GIB)
    model = tmp_path / "1" / "model.onnx"
    model.parent.mkdir()
    model.write_bytes(b"onnx")
    parts = engine_cache.engine_key_parts(builder, model, "cuda:0")
    assert parts["providers"] == [TENSORRT, CUDA, CPU]
    assert parts["tensorrt"]["version"] == "100300"
    assert parts["tensorrt"]["profile"]["trt_profile_max_shapes"] == "x:16x3"
    assert "tensorrt" not in engine_cache.engine_key_parts(_builder(config), model, "cpu")


def test_a_bad_budget_fails_the_load():
    config = _batched(("x", [3]))
    config.parameters["memory_bytes"].string_value = "lots"
    with pytest.raises(ModelLoadError, match="memory_bytes must be a non-negative integer"):
        _builder(config).providers("cuda:0", trt_cache=None)
