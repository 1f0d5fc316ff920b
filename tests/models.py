"""Test models, generated on the spot (never downloaded), in Triton's repository layout.

Every ``write_*`` function creates ``repo/<name>/config.pbtxt`` (unless ``config=False``)
and ``repo/<name>/<version>/model.<ext>`` and returns the model folder ``repo/<name>``.
The MLPs are :mod:`data_plane.mlp`'s, the generator the demo and the benchmarks use too.
MLP writers also save their weights as ``repo/<name>/weights.npz`` (outside the version
folder, so no runtime sees it); :func:`load_mlp_weights` and :func:`mlp_reference` compute
the expected outputs in numpy. Torch writers skip the calling test when torch is missing.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import helper

from data_plane.mlp import (
    ONNX_IR_VERSION as ONNX_IR_VERSION,
    ONNX_OPSET as ONNX_OPSET,
    MlpWeights as MlpWeights,
    mlp_reference as mlp_reference,
    mlp_weights as mlp_weights,
    save_onnx_model,
    write_mlp,
)
from foundation import datatypes
from foundation.proto import model_config_pb2 as mc
from runtimes.base import ModelRuntime, RuntimeOptions, RuntimeState

RuntimeT = TypeVar("RuntimeT", bound=ModelRuntime)

ONNX_ELEM_TYPES: dict[str, int] = {
    "BOOL": onnx.TensorProto.BOOL,
    "UINT8": onnx.TensorProto.UINT8,
    "UINT16": onnx.TensorProto.UINT16,
    "UINT32": onnx.TensorProto.UINT32,
    "UINT64": onnx.TensorProto.UINT64,
    "INT8": onnx.TensorProto.INT8,
    "INT16": onnx.TensorProto.INT16,
    "INT32": onnx.TensorProto.INT32,
    "INT64": onnx.TensorProto.INT64,
    "FP16": onnx.TensorProto.FLOAT16,
    "FP32": onnx.TensorProto.FLOAT,
    "FP64": onnx.TensorProto.DOUBLE,
    "BYTES": onnx.TensorProto.STRING,
    "BF16": onnx.TensorProto.BFLOAT16,
}
"""Every protocol datatype ONNX Runtime's CPU ``Identity`` kernel accepts (all of them)."""

DEFAULT_PYTHON_MODEL = """\
import numpy as np


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]

    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"] * 2}
"""
"""The model.py :func:`write_python_model` writes by default: ``OUTPUT0 = INPUT0 * 2``."""


def marker_model_source(marker: Path) -> str:
    """A ``model.py`` that writes ``marker`` when imported: proof that a file ran."""
    return textwrap.dedent(
        f"""\
        from pathlib import Path

        Path({str(marker)!r}).write_text("imported")


        class TritonPythonModel:
            def execute(self, inputs):
                return {{"OUTPUT0": inputs["INPUT0"]}}
        """
    )


def make_config(
    name: str,
    *,
    backend: str = "",
    platform: str = "",
    max_batch_size: int = 8,
    dynamic_batching: bool = True,
    instance_count: int = 1,
    inputs: Sequence[tuple[str, str, Sequence[int]]] = (),
    outputs: Sequence[tuple[str, str, Sequence[int]]] = (),
) -> mc.ModelConfig:
    """A ``ModelConfig`` from ``(name, protocol datatype, dims)`` triples."""
    config = mc.ModelConfig(
        name=name, backend=backend, platform=platform, max_batch_size=max_batch_size
    )
    for tensor_name, datatype, dims in inputs:
        config.input.add(name=tensor_name, data_type=_config_type(datatype), dims=list(dims))
    for tensor_name, datatype, dims in outputs:
        config.output.add(name=tensor_name, data_type=_config_type(datatype), dims=list(dims))
    if dynamic_batching and max_batch_size > 0:
        config.dynamic_batching.SetInParent()
    config.instance_group.add(count=instance_count, kind=mc.ModelInstanceGroup.KIND_AUTO)
    return config


def read_config(model_dir: Path) -> mc.ModelConfig:
    """Parse ``model_dir/config.pbtxt``."""
    return text_format.Parse((model_dir / "config.pbtxt").read_text(), mc.ModelConfig())


def write_config(model_dir: Path, config: mc.ModelConfig) -> None:
    """Write ``config`` as ``model_dir/config.pbtxt`` in Triton's text format."""
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))


async def load_runtime(
    runtime_class: type[RuntimeT],
    model_dir: Path,
    *,
    device: str = "cpu",
    version: int = 1,
    config: mc.ModelConfig | None = None,
    options: RuntimeOptions | None = None,
) -> RuntimeT:
    """Build and load ``runtime_class`` for ``model_dir`` (its config.pbtxt unless given)."""
    runtime = runtime_class(
        name=model_dir.name, version=version, options=options or RuntimeOptions()
    )
    await runtime.load(
        model_dir / str(version), config if config is not None else read_config(model_dir), device
    )
    return runtime


def state_of(runtime: ModelRuntime) -> RuntimeState:
    """``runtime.state``, read through a call so that mypy does not carry an earlier
    ``assert runtime.state is ...`` narrowing past the awaits that change it."""
    return runtime.state


def load_mlp_weights(model_dir: Path) -> MlpWeights:
    """The weights an MLP writer saved next to the model's versions."""
    with np.load(model_dir / "weights.npz") as data:
        count = len(data.files) // 2
        return [(data[f"arr_{2 * i}"], data[f"arr_{2 * i + 1}"]) for i in range(count)]


def write_onnx_mlp(
    repo: Path,
    name: str,
    sizes: Sequence[int] = (16, 32, 8),
    *,
    max_batch_size: int = 8,
    dynamic_batching: bool = True,
    version: int = 1,
    seed: int = 0,
    config: bool = True,
    instance_count: int = 1,
) -> Path:
    """Gemm+Relu MLP (:func:`data_plane.mlp.write_mlp`): ``INPUT0`` FP32 ``[-1, sizes[0]]``
    -> ``OUTPUT0`` FP32."""
    weights = mlp_weights(sizes, seed)
    model_dir = repo / name
    write_mlp(model_dir / str(version) / "model.onnx", weights)
    _save_weights(model_dir, weights)
    if config:
        write_config(
            model_dir,
            make_config(
                name,
                backend="onnxruntime",
                max_batch_size=max_batch_size,
                dynamic_batching=dynamic_batching,
                instance_count=instance_count,
                inputs=[("INPUT0", "FP32", _config_dims([sizes[0]], max_batch_size))],
                outputs=[("OUTPUT0", "FP32", _config_dims([sizes[-1]], max_batch_size))],
            ),
        )
    return model_dir


def write_onnx_add_sub(
    repo: Path,
    name: str,
    *,
    dtype: Literal["FP32", "INT32"] = "FP32",
    dims: Sequence[int] = (16,),
    max_batch_size: int = 8,
    version: int = 1,
    instance_count: int = 1,
    config: bool = True,
) -> Path:
    """Triton's classic "simple" model: ``OUTPUT0 = INPUT0 + INPUT1``,
    ``OUTPUT1 = INPUT0 - INPUT1``."""
    elem = ONNX_ELEM_TYPES[dtype]
    shape = _graph_shape(dims, max_batch_size)
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub",
        [helper.make_tensor_value_info(n, elem, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, elem, shape) for n in ("OUTPUT0", "OUTPUT1")],
    )
    model_dir = repo / name
    save_onnx_model(graph, model_dir / str(version) / "model.onnx")
    if config:
        write_config(
            model_dir,
            make_config(
                name,
                backend="onnxruntime",
                max_batch_size=max_batch_size,
                instance_count=instance_count,
                inputs=[(n, dtype, dims) for n in ("INPUT0", "INPUT1")],
                outputs=[(n, dtype, dims) for n in ("OUTPUT0", "OUTPUT1")],
            ),
        )
    return model_dir


def write_onnx_identity(
    repo: Path,
    name: str,
    *,
    datatype: str,
    dims: Sequence[int] = (-1,),
    max_batch_size: int = 8,
    version: int = 1,
    instance_count: int = 1,
    config: bool = True,
) -> Path:
    """``OUTPUT0 = Identity(INPUT0)`` for any key of :data:`ONNX_ELEM_TYPES`.

    With ``max_batch_size`` 0 the graph's shape is ``dims`` exactly (fixed where given),
    otherwise a symbolic batch dimension comes first.
    """
    elem = ONNX_ELEM_TYPES[datatype]
    shape = _graph_shape(dims, max_batch_size)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity",
        [helper.make_tensor_value_info("INPUT0", elem, shape)],
        [helper.make_tensor_value_info("OUTPUT0", elem, shape)],
    )
    model_dir = repo / name
    save_onnx_model(graph, model_dir / str(version) / "model.onnx")
    if config:
        write_config(
            model_dir,
            make_config(
                name,
                backend="onnxruntime",
                max_batch_size=max_batch_size,
                instance_count=instance_count,
                inputs=[("INPUT0", datatype, dims)],
                outputs=[("OUTPUT0", datatype, dims)],
            ),
        )
    return model_dir


def write_torchscript_mlp(
    repo: Path,
    name: str,
    sizes: Sequence[int] = (16, 32, 8),
    *,
    max_batch_size: int = 8,
    version: int = 1,
    seed: int = 0,
    instance_count: int = 1,
) -> Path:
    """The MLP of :func:`write_onnx_mlp` as TorchScript ``model.pt`` (skips without torch)."""
    torch = pytest.importorskip("torch")
    module = _torch_mlp(torch, mlp_weights(sizes, seed))
    example = torch.zeros(2, sizes[0])
    model_dir = _torch_mlp_folder(repo, name, sizes, seed, max_batch_size, instance_count)
    path = model_dir / str(version) / "model.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.trace(module, example).save(str(path))
    return model_dir


def write_torch_export_mlp(
    repo: Path,
    name: str,
    sizes: Sequence[int] = (16, 32, 8),
    *,
    max_batch_size: int = 8,
    version: int = 1,
    seed: int = 0,
    instance_count: int = 1,
) -> Path:
    """The MLP of :func:`write_onnx_mlp` as a ``torch.export`` ``model.pt2`` (dynamic batch)."""
    torch = pytest.importorskip("torch")
    module = _torch_mlp(torch, mlp_weights(sizes, seed))
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(module, (torch.zeros(2, sizes[0]),), dynamic_shapes=({0: batch},))
    model_dir = _torch_mlp_folder(repo, name, sizes, seed, max_batch_size, instance_count)
    path = model_dir / str(version) / "model.pt2"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return model_dir


def write_torchscript_add_sub(
    repo: Path,
    name: str,
    *,
    returns: Literal["tuple", "dict"] = "tuple",
    dims: Sequence[int] = (4,),
    max_batch_size: int = 8,
    version: int = 1,
) -> Path:
    """TorchScript add/sub with two inputs and two outputs, returned as a tuple or a dict.

    The dict variant names its keys ``OUTPUT1`` first, so a runtime mapping by position
    instead of by name gives wrong answers.
    """
    torch = pytest.importorskip("torch")

    class AddSub(torch.nn.Module):  # type: ignore[misc, name-defined]
        def forward(self, a: Any, b: Any) -> Any:
            if returns == "dict":
                return {"OUTPUT1": a - b, "OUTPUT0": a + b}
            return a + b, a - b

    example = (torch.zeros(2, *dims), torch.zeros(2, *dims))
    model_dir = repo / name
    path = model_dir / str(version) / "model.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.trace(AddSub(), example, strict=False).save(str(path))
    write_config(
        model_dir,
        make_config(
            name,
            backend="pytorch",
            max_batch_size=max_batch_size,
            inputs=[(n, "FP32", dims) for n in ("INPUT0", "INPUT1")],
            outputs=[(n, "FP32", dims) for n in ("OUTPUT0", "OUTPUT1")],
        ),
    )
    return model_dir


def write_python_model(
    repo: Path,
    name: str,
    source: str | None = None,
    *,
    datatype: str = "FP32",
    dims: Sequence[int] = (-1,),
    max_batch_size: int = 8,
    version: int = 1,
    instance_count: int = 1,
    outputs: Sequence[str] = ("OUTPUT0",),
) -> Path:
    """A ``model.py`` (``source``, dedented, or :data:`DEFAULT_PYTHON_MODEL`) with one
    input ``INPUT0`` and the named ``outputs``, all of ``datatype``."""
    model_dir = repo / name
    path = model_dir / str(version) / "model.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source) if source is not None else DEFAULT_PYTHON_MODEL)
    write_config(
        model_dir,
        make_config(
            name,
            backend="python",
            max_batch_size=max_batch_size,
            instance_count=instance_count,
            inputs=[("INPUT0", datatype, dims)],
            outputs=[(n, datatype, dims) for n in outputs],
        ),
    )
    return model_dir


def _config_type(datatype: str) -> mc.DataType:
    return cast(mc.DataType, datatypes.config_from_protocol(datatype))


def _config_dims(dims: Sequence[int], max_batch_size: int) -> list[int]:
    """Config dims leave the batch out when batching and spell it as -1 otherwise."""
    return list(dims) if max_batch_size > 0 else [-1, *dims]


def _graph_shape(dims: Sequence[int], max_batch_size: int) -> list[int | str]:
    shape: list[int | str] = [d if d >= 0 else f"d{i}" for i, d in enumerate(dims)]
    return ["batch", *shape] if max_batch_size > 0 else shape


def _save_weights(model_dir: Path, weights: MlpWeights) -> None:
    # Positional arrays are stored as arr_0, arr_1, ...: W0, b0, W1, b1, ...
    np.savez(model_dir / "weights.npz", *(a for layer in weights for a in layer))


def _torch_mlp(torch: Any, weights: MlpWeights) -> Any:
    layers: list[Any] = []
    for i, (w, b) in enumerate(weights):
        linear = torch.nn.Linear(w.shape[0], w.shape[1])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))
            linear.bias.copy_(torch.from_numpy(b))
        layers.append(linear)
        if i < len(weights) - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).eval()


def _torch_mlp_folder(
    repo: Path,
    name: str,
    sizes: Sequence[int],
    seed: int,
    max_batch_size: int,
    instance_count: int,
) -> Path:
    model_dir = repo / name
    model_dir.mkdir(parents=True, exist_ok=True)
    _save_weights(model_dir, mlp_weights(sizes, seed))
    write_config(
        model_dir,
        make_config(
            name,
            backend="pytorch",
            max_batch_size=max_batch_size,
            instance_count=instance_count,
            inputs=[("INPUT0", "FP32", _config_dims([sizes[0]], max_batch_size))],
            outputs=[("OUTPUT0", "FP32", _config_dims([sizes[-1]], max_batch_size))],
        ),
    )
    return model_dir
