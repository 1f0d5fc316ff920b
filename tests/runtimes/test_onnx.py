"""OnnxRuntime: numbers against numpy, datatypes, instances, session options, failures.

Auto-complete is tested in test_onnx_complete.py, the warm engine cache in
test_onnx_engine_cache.py."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from foundation.proto import model_config_pb2 as mc
from runtimes.base import RuntimeOptions, RuntimeState
from runtimes.errors import InvalidArgumentError, ModelLoadError, ModelNotReadyError
from runtimes.onnx.builder import SessionBuilder
from runtimes.onnx.runtime import OnnxRuntime
from runtimes.onnx.threads import ThreadPolicy
from tests.models import (
    ONNX_ELEM_TYPES,
    ONNX_IR_VERSION,
    ONNX_OPSET,
    load_mlp_weights,
    load_runtime,
    mlp_reference,
    read_config,
    state_of,
    write_onnx_add_sub,
    write_onnx_identity,
    write_onnx_mlp,
)


def _threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def _sample(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Values that exercise each datatype's edges and survive a round trip exactly."""
    rng = np.random.default_rng(1)
    size = int(np.prod(shape))
    if datatype == "BOOL":
        return rng.integers(0, 2, size).astype(bool).reshape(shape)
    if datatype == "BYTES":
        words = [b"hello", "\u00e9t\u00e9".encode(), b"", b"a\x00b", b"\xf0\x9f\x99\x82"]
        return np.array([words[i % len(words)] for i in range(size)], dtype=object).reshape(shape)
    if datatype == "BF16":
        # bfloat16 values are float32 values with the low 16 bits clear.
        bits = rng.standard_normal(size).astype(np.float32).view(np.uint32) & 0xFFFF0000
        return bits.view(np.float32).reshape(shape)
    dtype = np.dtype(datatype.lower().replace("fp", "float"))
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = np.array([info.min, info.max, 0, 1], dtype=dtype)
    else:
        values = np.array([np.finfo(dtype).max, -np.inf, np.nan, 0.5], dtype=dtype)
    return np.resize(values, shape)


@pytest.mark.anyio
async def test_mlp_matches_numpy_then_unloads(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path, "mlp")
    runtime = await load_runtime(OnnxRuntime, model_dir)
    assert state_of(runtime) is RuntimeState.READY
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)

    outputs = await runtime.infer({"INPUT0": x})

    assert list(outputs) == ["OUTPUT0"]
    assert outputs["OUTPUT0"].dtype == np.float32
    np.testing.assert_allclose(
        outputs["OUTPUT0"], mlp_reference(load_mlp_weights(model_dir), x), rtol=1e-5, atol=1e-5
    )
    await runtime.unload()
    assert state_of(runtime) is RuntimeState.UNLOADED
    with pytest.raises(ModelNotReadyError):
        await runtime.infer({"INPUT0": x})


@pytest.mark.anyio
@pytest.mark.parametrize("dtype", ["FP32", "INT32"])
async def test_add_sub(tmp_path: Path, dtype: Literal["FP32", "INT32"]) -> None:
    runtime = await load_runtime(OnnxRuntime, write_onnx_add_sub(tmp_path, "simple", dtype=dtype))
    rng = np.random.default_rng(0)
    numpy_dtype = np.float32 if dtype == "FP32" else np.int32
    a, b = (rng.integers(-100, 100, (3, 16)).astype(numpy_dtype) for _ in "ab")

    outputs = await runtime.infer({"INPUT0": a, "INPUT1": b})

    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)
    await runtime.unload()


@pytest.mark.anyio
@pytest.mark.parametrize("datatype", sorted(ONNX_ELEM_TYPES))
async def test_identity_round_trips_every_datatype(tmp_path: Path, datatype: str) -> None:
    model_dir = write_onnx_identity(tmp_path, f"id_{datatype.lower()}", datatype=datatype)
    runtime = await load_runtime(OnnxRuntime, model_dir)
    x = _sample(datatype, (2, 5))

    out = (await runtime.infer({"INPUT0": x}))["OUTPUT0"]

    assert out.dtype == x.dtype
    assert out.shape == x.shape
    if datatype == "BYTES":
        assert out.tolist() == x.tolist()
        assert all(type(item) is bytes for item in out.reshape(-1))
    else:
        np.testing.assert_array_equal(out, x)
    await runtime.unload()


@pytest.mark.anyio
async def test_bf16_inputs_round_to_nearest_even(tmp_path: Path) -> None:
    runtime = await load_runtime(OnnxRuntime, write_onnx_identity(tmp_path, "bf", datatype="BF16"))
    step = 2.0**-8  # half a bfloat16 ulp at 1.0
    x = np.array([[1 + step, 1 + 3 * step, np.nan, -np.inf, 3.4e38]], dtype=np.float32)

    out = (await runtime.infer({"INPUT0": x}))["OUTPUT0"]

    # Ties go to the even mantissa; NaN stays NaN; the largest float32 overflows to inf.
    expected = np.array([[1.0, 1 + 4 * step, np.nan, -np.inf, np.inf]], dtype=np.float32)
    np.testing.assert_array_equal(out, expected)
    await runtime.unload()


@pytest.mark.anyio
async def test_bytes_that_are_not_utf8_are_rejected(tmp_path: Path) -> None:
    runtime = await load_runtime(OnnxRuntime, write_onnx_identity(tmp_path, "s", datatype="BYTES"))
    with pytest.raises(InvalidArgumentError, match="UTF-8"):
        await runtime.infer({"INPUT0": np.array([[b"ok", b"\xff\xfe"]], dtype=object)})
    await runtime.unload()


@pytest.mark.anyio
async def test_two_instances_serve_concurrently_on_named_threads(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path, "mlp2", instance_count=2)
    runtime = await load_runtime(OnnxRuntime, model_dir)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(8)]

    results = await asyncio.gather(*(runtime.infer({"INPUT0": x}) for x in xs))

    weights = load_mlp_weights(model_dir)
    for x, result in zip(xs, results, strict=True):
        np.testing.assert_allclose(
            result["OUTPUT0"], mlp_reference(weights, x), rtol=1e-5, atol=1e-5
        )
    assert 1 <= len(_threads("ort-mlp2_")) <= 2
    await runtime.unload()
    assert _threads("ort-mlp2_") == []


@pytest.mark.anyio
async def test_returns_only_configured_outputs(tmp_path: Path) -> None:
    model_dir = write_onnx_add_sub(tmp_path, "simple")
    config = read_config(model_dir)
    del config.output[0]
    runtime = await load_runtime(OnnxRuntime, model_dir, config=config)
    a = np.ones((1, 16), np.float32)

    assert list(await runtime.infer({"INPUT0": a, "INPUT1": a})) == ["OUTPUT1"]
    await runtime.unload()


@pytest.mark.anyio
async def test_config_without_outputs_returns_all_model_outputs(tmp_path: Path) -> None:
    model_dir = write_onnx_add_sub(tmp_path, "simple")
    config = read_config(model_dir)
    del config.output[:]
    runtime = await load_runtime(OnnxRuntime, model_dir, config=config)
    a = np.ones((1, 16), np.float32)

    assert sorted(await runtime.infer({"INPUT0": a, "INPUT1": a})) == ["OUTPUT0", "OUTPUT1"]
    await runtime.unload()


@pytest.mark.anyio
async def test_bad_requests_are_invalid_arguments(tmp_path: Path) -> None:
    runtime = await load_runtime(OnnxRuntime, write_onnx_add_sub(tmp_path, "simple"))
    a = np.ones((1, 16), np.float32)
    with pytest.raises(InvalidArgumentError, match="INPUT1"):
        await runtime.infer({"INPUT0": a})
    with pytest.raises(InvalidArgumentError, match="EXTRA"):
        await runtime.infer({"INPUT0": a, "INPUT1": a, "EXTRA": a})
    with pytest.raises(InvalidArgumentError):
        await runtime.infer({"INPUT0": a, "INPUT1": np.ones((1, 7), np.float32)})
    await runtime.unload()


@pytest.mark.anyio
async def test_corrupt_model_file_fails_load_clearly(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path, "broken")
    (model_dir / "1" / "model.onnx").write_bytes(b"this is not a protobuf")
    runtime = OnnxRuntime(name="broken", version=1, options=RuntimeOptions())

    with pytest.raises(ModelLoadError, match=r"broken.*model\.onnx"):
        await runtime.load(model_dir / "1", read_config(model_dir), "cpu")
    assert state_of(runtime) is RuntimeState.FAILED
    await runtime.unload()
    assert state_of(runtime) is RuntimeState.UNLOADED


@pytest.mark.anyio
async def test_missing_model_file_fails_load(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path, "gone")
    (model_dir / "1" / "model.onnx").unlink()
    with pytest.raises(ModelLoadError, match="does not exist"):
        await load_runtime(OnnxRuntime, model_dir)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        pytest.param(
            lambda c: setattr(c.input[0], "data_type", mc.TYPE_INT32), "TYPE_INT32", id="dtype"
        ),
        pytest.param(lambda c: setattr(c.input[0], "name", "WRONG"), "WRONG", id="input-name"),
        pytest.param(lambda c: setattr(c.output[0], "name", "NOPE"), "NOPE", id="output-name"),
    ],
)
async def test_config_disagreeing_with_model_fails_load(tmp_path: Path, edit, message: str) -> None:
    model_dir = write_onnx_mlp(tmp_path, "mlp")
    config = read_config(model_dir)
    edit(config)
    with pytest.raises(ModelLoadError, match=message):
        await load_runtime(OnnxRuntime, model_dir, config=config)


@pytest.mark.anyio
async def test_thread_count_parameters(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path, "mlp")
    config = read_config(model_dir)
    config.parameters["intra_op_thread_count"].string_value = "1"
    config.parameters["inter_op_thread_count"].string_value = "1"
    runtime = await load_runtime(OnnxRuntime, model_dir, config=config)
    await runtime.unload()

    config.parameters["intra_op_thread_count"].string_value = "many"
    with pytest.raises(ModelLoadError, match="intra_op_thread_count"):
        await load_runtime(OnnxRuntime, model_dir, config=config)


@pytest.mark.anyio
async def test_unknown_device_fails_load(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="tpu:0"):
        await load_runtime(OnnxRuntime, write_onnx_mlp(tmp_path, "mlp"), device="tpu:0")


@pytest.mark.anyio
@pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(), reason="CUDA EP present"
)
async def test_cuda_device_without_cuda_provider_falls_back_to_cpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model_dir = write_onnx_mlp(tmp_path, "mlp")
    with caplog.at_level(logging.WARNING, logger="runtimes.onnx"):
        runtime = await load_runtime(OnnxRuntime, model_dir, device="cuda:0")
    assert "runs it on CPU" in caplog.text
    x = np.ones((2, 16), np.float32)
    np.testing.assert_allclose(
        (await runtime.infer({"INPUT0": x}))["OUTPUT0"],
        mlp_reference(load_mlp_weights(model_dir), x),
        rtol=1e-5,
        atol=1e-5,
    )
    await runtime.unload()


@pytest.mark.anyio
async def test_unload_is_idempotent(tmp_path: Path) -> None:
    never_loaded = OnnxRuntime(name="x", version=1, options=RuntimeOptions())
    await never_loaded.unload()
    assert state_of(never_loaded) is RuntimeState.UNLOADED

    runtime = await load_runtime(OnnxRuntime, write_onnx_mlp(tmp_path, "mlp"))
    await runtime.unload()
    await runtime.unload()
    assert state_of(runtime) is RuntimeState.UNLOADED


@pytest.mark.anyio
async def test_load_twice_is_refused(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path, "mlp")
    runtime = await load_runtime(OnnxRuntime, model_dir)
    with pytest.raises(RuntimeError, match="READY"):
        await runtime.load(model_dir / "1", read_config(model_dir), "cpu")
    await runtime.unload()


@pytest.mark.anyio
async def test_models_mixing_bf16_and_bytes_are_refused(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["A"], ["A_OUT"]),
            helper.make_node("Identity", ["S"], ["S_OUT"]),
        ],
        "mixed",
        [
            helper.make_tensor_value_info("A", onnx.TensorProto.BFLOAT16, ["batch"]),
            helper.make_tensor_value_info("S", onnx.TensorProto.STRING, ["batch"]),
        ],
        [
            helper.make_tensor_value_info("A_OUT", onnx.TensorProto.BFLOAT16, ["batch"]),
            helper.make_tensor_value_info("S_OUT", onnx.TensorProto.STRING, ["batch"]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = ONNX_IR_VERSION
    model_dir = tmp_path / "mixed"
    (model_dir / "1").mkdir(parents=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))

    with pytest.raises(ModelLoadError, match="BF16 and BYTES"):
        await load_runtime(OnnxRuntime, model_dir, config=mc.ModelConfig(name="mixed"))


@pytest.mark.parametrize(
    ("parameters", "weight_bytes", "threads", "spinning"),
    [
        pytest.param({}, 2**20, 1, "0", id="small-model-one-thread"),
        pytest.param({}, 64 * 2**20, 4, "1", id="large-model-spinning-pool"),
        pytest.param({"allow_spinning": "true"}, 2**20, 1, "1", id="small-model-opted-in"),
        pytest.param({"allow_spinning": "false"}, 64 * 2**20, 4, "0", id="large-opted-out"),
        pytest.param({"intra_op_thread_count": "3"}, 2**20, 3, "0", id="small-count-set"),
        pytest.param({"intra_op_thread_count": "1"}, 64 * 2**20, 1, "0", id="large-count-one"),
    ],
)
def test_session_threads_follow_the_policy_unless_configured(
    tmp_path: Path, parameters: dict[str, str], weight_bytes: int, threads: int, spinning: str
) -> None:
    config = read_config(write_onnx_mlp(tmp_path, "mlp"))
    del config.instance_group[:]
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    builder = SessionBuilder("mlp", config, RuntimeOptions(), weight_bytes, cores=4)
    options = builder.session_options()
    assert options.intra_op_num_threads == threads
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == spinning
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == spinning


def test_server_thread_setting_overrides_the_policy(tmp_path: Path) -> None:
    config = read_config(write_onnx_mlp(tmp_path, "mlp"))
    builder = SessionBuilder("mlp", config, RuntimeOptions(intra_op_threads=2), 2**20, cores=4)
    assert builder.session_options().intra_op_num_threads == 2


@pytest.mark.parametrize(
    ("parameters", "device", "max_batch_size", "server_threads", "expected"),
    [
        pytest.param({}, "cpu", 8, 0, ThreadPolicy(4, True), id="small-batching-cpu"),
        pytest.param({}, "cuda:0", 8, 0, None, id="gpu"),
        pytest.param({}, "cpu", 0, 0, None, id="no-batching"),
        pytest.param({}, "cpu", 8, 2, None, id="server-sets-threads"),
        pytest.param({"intra_op_thread_count": "1"}, "cpu", 8, 0, None, id="threads-configured"),
        pytest.param({"allow_spinning": "false"}, "cpu", 8, 0, None, id="spinning-configured"),
    ],
)
def test_a_wide_session_only_where_nothing_configures_threads(
    tmp_path: Path,
    parameters: dict[str, str],
    device: str,
    max_batch_size: int,
    server_threads: int,
    expected: ThreadPolicy | None,
) -> None:
    config = read_config(write_onnx_mlp(tmp_path, "mlp", max_batch_size=max_batch_size))
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    options = RuntimeOptions(intra_op_threads=server_threads)
    builder = SessionBuilder("mlp", config, options, 2**20, cores=4)
    assert builder.latency_policy(device) == expected


@pytest.mark.anyio
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores for a wide pool")
async def test_small_batches_run_wide_and_full_ones_narrow(tmp_path: Path) -> None:
    model_dir = write_onnx_mlp(tmp_path, "mlp", max_batch_size=8)
    runtime = await load_runtime(OnnxRuntime, model_dir)
    try:
        session = runtime._session
        assert session is not None and session.latency_session is not None
        wide_options = session.latency_session.get_session_options()
        assert wide_options.intra_op_num_threads == len(os.sched_getaffinity(0))
        assert session.session.get_session_options().intra_op_num_threads == 1
        rows = np.random.default_rng(0).random((8, 16), dtype=np.float32)
        expected = session.session.run(None, {"INPUT0": rows})[0]
        # Whichever session runs it, a batch gets the same answer; the last batch's
        # rows say which one the next starts from.
        for count, is_wide in [(1, True), (8, False), (5, False), (2, True), (5, True)]:
            outputs = await runtime.infer({"INPUT0": rows[:count]})
            np.testing.assert_allclose(outputs["OUTPUT0"], expected[:count], rtol=1e-5)
            assert session.session_for(count) is (
                session.latency_session if is_wide else session.session
            )
    finally:
        await runtime.unload()


@pytest.mark.anyio
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores for a wide pool")
async def test_a_one_row_batch_runs_on_the_event_loop_and_larger_ones_off_it(
    tmp_path: Path,
) -> None:
    model_dir = write_onnx_mlp(tmp_path, "mlp", max_batch_size=8)
    runtime = await load_runtime(OnnxRuntime, model_dir)
    try:
        rows = np.random.default_rng(1).random((2, 16), dtype=np.float32)
        expected = (await runtime.infer({"INPUT0": rows}))["OUTPUT0"]
        # With the executor shut down, only a batch that never reaches it can be answered.
        assert runtime._executor is not None
        runtime._executor.shutdown(wait=True)
        outputs = await runtime.infer({"INPUT0": rows[:1]})
        np.testing.assert_allclose(outputs["OUTPUT0"], expected[:1], rtol=1e-5)
        with pytest.raises(RuntimeError, match="shutdown"):
            await runtime.infer({"INPUT0": rows})
    finally:
        await runtime.unload()


@pytest.mark.anyio
@pytest.mark.parametrize("spelling", ["absolute", "dot-dot"])
async def test_default_model_filename_cannot_open_a_model_outside(
    tmp_path: Path, spelling: str
) -> None:
    # The config is built here, not parsed, so the runtime's own check is what stops it.
    outside = write_onnx_mlp(tmp_path / "outside", "o") / "1" / "model.onnx"
    model_dir = write_onnx_mlp(tmp_path / "repo", "m")
    (model_dir / "1" / "model.onnx").unlink()
    config = read_config(model_dir)
    config.default_model_filename = (
        str(outside) if spelling == "absolute" else "../../../outside/o/1/model.onnx"
    )
    message = "'default_model_filename' must be the name of a file"

    with pytest.raises(ModelLoadError, match=message):
        OnnxRuntime.complete_config(model_dir / "1", config)
    with pytest.raises(ModelLoadError, match=message):
        await load_runtime(OnnxRuntime, model_dir, config=config)


@pytest.mark.anyio
async def test_a_version_folder_linked_outside_the_model_folder_is_refused(
    tmp_path: Path,
) -> None:
    outside = write_onnx_mlp(tmp_path / "outside", "o") / "1"
    model_dir = write_onnx_mlp(tmp_path / "repo", "m", version=2)
    (model_dir / "1").symlink_to(outside, target_is_directory=True)

    with pytest.raises(ModelLoadError, match="outside the model folder"):
        await load_runtime(OnnxRuntime, model_dir, version=1)


@pytest.mark.anyio
@pytest.mark.parametrize("spelling", ["absolute", "dot-dot"])
@pytest.mark.parametrize("has_engine_cache", [False, True], ids=["no-cache", "engine-cache"])
async def test_external_weights_outside_the_version_folder_are_refused(
    tmp_path: Path, spelling: str, has_engine_cache: bool
) -> None:
    # ONNX Runtime checks this itself (since its 2025-12 fix, microsoft/onnxruntime#26776);
    # the test keeps that guarantee from going away with an older engine.
    secret = tmp_path / "outside" / "secret.bin"
    secret.parent.mkdir()
    secret.write_bytes(np.arange(4, dtype=np.float32).tobytes())
    weights = onnx.TensorProto(name="W", data_type=onnx.TensorProto.FLOAT, dims=[4])
    weights.data_location = onnx.TensorProto.EXTERNAL
    location = str(secret) if spelling == "absolute" else "../../../outside/secret.bin"
    for key, value in (("location", location), ("length", "16")):
        weights.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "W"], ["OUTPUT0"])],
        "leak",
        [helper.make_tensor_value_info("INPUT0", onnx.TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("OUTPUT0", onnx.TensorProto.FLOAT, [4])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = ONNX_IR_VERSION
    model_dir = tmp_path / "repo" / "leak"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.onnx").write_bytes(model.SerializeToString())
    config = mc.ModelConfig(name="leak", backend="onnxruntime")
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)

    with pytest.raises(ModelLoadError, match="[Ee]xternal data"):
        await load_runtime(
            OnnxRuntime,
            model_dir,
            config=config,
            options=RuntimeOptions(cache_dir=tmp_path / "cache" if has_engine_cache else None),
        )
