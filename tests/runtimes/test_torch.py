"""TorchRuntime: TorchScript and torch.export models against numpy, mapping, failures."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from foundation.proto import model_config_pb2 as mc
from runtimes.base import RuntimeOptions, RuntimeState
from runtimes.errors import (
    InternalError,
    InvalidArgumentError,
    ModelLoadError,
    ModelNotReadyError,
)
from runtimes.torch import TorchRuntime
from tests.models import (
    load_mlp_weights,
    load_runtime,
    mlp_reference,
    read_config,
    state_of,
    write_config,
    write_python_model,
    write_torch_export_mlp,
    write_torchscript_add_sub,
    write_torchscript_mlp,
)

torch = pytest.importorskip("torch", reason="PyTorch is an optional extra (zeroserve[torch])")


@pytest.mark.anyio
@pytest.mark.parametrize(
    "write", [write_torchscript_mlp, write_torch_export_mlp], ids=["torchscript", "export"]
)
async def test_mlp_matches_numpy_then_unloads(tmp_path: Path, write) -> None:
    model_dir = write(tmp_path, "mlp")
    runtime = await load_runtime(TorchRuntime, model_dir)
    assert state_of(runtime) is RuntimeState.READY
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    x.flags.writeable = False  # request buffers arrive read-only

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
@pytest.mark.parametrize("returns", ["tuple", "dict"])
async def test_outputs_map_by_config_order_or_name(tmp_path: Path, returns) -> None:
    runtime = await load_runtime(
        TorchRuntime, write_torchscript_add_sub(tmp_path, "addsub", returns=returns)
    )
    a = np.array([[1, 2, 3, 4]], np.float32)
    b = np.array([[10, 20, 30, 40]], np.float32)

    outputs = await runtime.infer({"INPUT0": a, "INPUT1": b})

    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)
    await runtime.unload()


@pytest.mark.anyio
async def test_bf16_tensors_are_cast_on_the_way_in_and_out(tmp_path: Path) -> None:
    model_dir = write_torchscript_add_sub(tmp_path, "addsub")
    config = read_config(model_dir)
    for entry in config.input:
        entry.data_type = mc.TYPE_BF16
    for output in config.output:
        output.data_type = mc.TYPE_BF16
    runtime = await load_runtime(TorchRuntime, model_dir, config=config)
    a = np.array([[1.5, 2.0, -3.25, 256.0]], np.float32)
    b = np.array([[1.0, 1.0, 1.0, 1.0]], np.float32)

    outputs = await runtime.infer({"INPUT0": a, "INPUT1": b})

    # 256 + 1 is not a bfloat16 (8 significant bits): it rounds back to 256.
    np.testing.assert_array_equal(outputs["OUTPUT0"], [[2.5, 3.0, -2.25, 256.0]])
    assert outputs["OUTPUT0"].dtype == np.float32
    await runtime.unload()


@pytest.mark.anyio
async def test_two_instances_serve_concurrently(tmp_path: Path) -> None:
    model_dir = write_torchscript_mlp(tmp_path, "mlp2", instance_count=2)
    runtime = await load_runtime(TorchRuntime, model_dir)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((3, 16)).astype(np.float32) for _ in range(8)]

    results = await asyncio.gather(*(runtime.infer({"INPUT0": x}) for x in xs))

    weights = load_mlp_weights(model_dir)
    for x, result in zip(xs, results, strict=True):
        expected = mlp_reference(weights, x)
        np.testing.assert_allclose(result["OUTPUT0"], expected, rtol=1e-5, atol=1e-5)
    assert 1 <= len([t for t in threading.enumerate() if t.name.startswith("torch-mlp2_")]) <= 2
    await runtime.unload()
    assert not [t for t in threading.enumerate() if t.name.startswith("torch-mlp2_")]


@pytest.mark.anyio
async def test_bad_requests(tmp_path: Path) -> None:
    runtime = await load_runtime(TorchRuntime, write_torchscript_mlp(tmp_path, "mlp"))
    with pytest.raises(InvalidArgumentError, match="INPUT0"):
        await runtime.infer({})
    with pytest.raises(InvalidArgumentError, match="EXTRA"):
        await runtime.infer({"INPUT0": np.ones((1, 16), np.float32), "EXTRA": np.ones(1)})
    with pytest.raises(InternalError, match="PyTorch model failed"):
        await runtime.infer({"INPUT0": np.ones((1, 7), np.float32)})
    await runtime.unload()


@pytest.mark.anyio
async def test_output_count_mismatch_is_internal_error(tmp_path: Path) -> None:
    model_dir = write_torchscript_add_sub(tmp_path, "addsub")
    config = read_config(model_dir)
    del config.output[1]
    runtime = await load_runtime(TorchRuntime, model_dir, config=config)
    a = np.ones((1, 4), np.float32)
    with pytest.raises(InternalError, match="returned 2 outputs; the config lists 1"):
        await runtime.infer({"INPUT0": a, "INPUT1": a})
    await runtime.unload()


@pytest.mark.anyio
async def test_corrupt_file_fails_load_clearly(tmp_path: Path) -> None:
    model_dir = write_torchscript_mlp(tmp_path, "broken")
    (model_dir / "1" / "model.pt").write_bytes(b"not a zip archive")
    runtime = TorchRuntime(name="broken", version=1, options=RuntimeOptions())

    with pytest.raises(ModelLoadError, match=r"broken.*model\.pt"):
        await runtime.load(model_dir / "1", read_config(model_dir), "cpu")

    assert state_of(runtime) is RuntimeState.FAILED
    await runtime.unload()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        pytest.param(lambda c: c.ClearField("output"), "outputs listed", id="no-outputs"),
        pytest.param(lambda c: c.ClearField("input"), "inputs listed", id="no-inputs"),
        pytest.param(
            lambda c: setattr(c.input[0], "data_type", mc.TYPE_STRING), "TYPE_STRING", id="bytes"
        ),
        pytest.param(
            lambda c: setattr(c, "default_model_filename", "other.pt"), "other.pt", id="no-file"
        ),
    ],
)
async def test_unusable_configs_fail_load(tmp_path: Path, edit, message: str) -> None:
    model_dir = write_torchscript_mlp(tmp_path, "mlp")
    config = read_config(model_dir)
    edit(config)
    with pytest.raises(ModelLoadError, match=message):
        await load_runtime(TorchRuntime, model_dir, config=config)


@pytest.mark.anyio
async def test_unknown_or_missing_devices_fail_load(tmp_path: Path) -> None:
    model_dir = write_torchscript_mlp(tmp_path, "mlp")
    with pytest.raises(ModelLoadError, match="tpu:0"):
        await load_runtime(TorchRuntime, model_dir, device="tpu:0")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA device"):
            await load_runtime(TorchRuntime, model_dir, device="cuda:0")


@pytest.mark.anyio
async def test_python_file_is_not_a_torch_model(tmp_path: Path) -> None:
    model_dir = write_python_model(tmp_path, "py")
    config = read_config(model_dir)
    config.backend = "pytorch"
    write_config(model_dir, config)
    with pytest.raises(ModelLoadError, match=r"no model\.pt or model\.pt2"):
        await load_runtime(TorchRuntime, model_dir)


@pytest.mark.anyio
async def test_unload_is_idempotent(tmp_path: Path) -> None:
    await TorchRuntime(name="x", version=1, options=RuntimeOptions()).unload()
    runtime = await load_runtime(TorchRuntime, write_torchscript_mlp(tmp_path, "mlp"))
    await runtime.unload()
    await runtime.unload()
    assert state_of(runtime) is RuntimeState.UNLOADED


@pytest.mark.anyio
async def test_default_model_filename_cannot_open_a_model_outside(tmp_path: Path) -> None:
    # The config is built here, not parsed, so the runtime's own check is what stops it.
    outside = write_torchscript_mlp(tmp_path / "outside", "o") / "1" / "model.pt"
    model_dir = write_torchscript_mlp(tmp_path / "repo", "m")
    (model_dir / "1" / "model.pt").unlink()
    config = read_config(model_dir)
    config.default_model_filename = str(outside)

    with pytest.raises(ModelLoadError, match="'default_model_filename' must be the name of a file"):
        await load_runtime(TorchRuntime, model_dir, config=config)
