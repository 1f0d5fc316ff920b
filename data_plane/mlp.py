"""ONNX MLPs generated from a seed, never downloaded: the demo's model (:mod:`data_plane.demo`),
the benchmarks' (``bench/models.py``) and the tests' (``tests/models.py``).

An MLP of widths ``(w0, w1, ..., wn)`` is a ``Gemm`` and a ``Relu`` per hidden layer and a
final ``Gemm``: ``INPUT0`` FP32 ``[batch, w0]`` to ``OUTPUT0`` FP32 ``[batch, wn]``, the batch
dimension left dynamic. :func:`mlp_weights` draws the weights from a seed and
:func:`mlp_reference` computes the same function in numpy, so that whoever serves a generated
MLP can check the answers against it. ``onnx`` is imported only to write a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeAlias

import numpy as np

if TYPE_CHECKING:
    import onnx

INPUT_NAME: Final = "INPUT0"
OUTPUT_NAME: Final = "OUTPUT0"
ONNX_OPSET: Final = 17
"""An opset every ONNX Runtime from 1.14 on runs (``onnx`` may default to a newer one)."""
ONNX_IR_VERSION: Final = 8

MlpWeights: TypeAlias = list[tuple[np.ndarray, np.ndarray]]
"""Per layer ``(W, b)`` with ``W`` shaped ``[in, out]``: ``y = x @ W + b``."""


def mlp_weights(widths: Sequence[int], seed: int) -> MlpWeights:
    """Weights for an MLP of layer ``widths`` (input first), the same for the same seed.

    ``W`` is scaled by ``1/sqrt(fan_in)`` and ``b`` by 0.1, so that the activations of a
    stack of a few ReLU layers stay near unit size (each one halves their variance) and a
    served answer compares with :func:`mlp_reference` at a float32 tolerance.
    """
    if len(widths) < 2 or any(width < 1 for width in widths):
        raise ValueError(f"an MLP needs two or more positive widths, not {tuple(widths)}")
    rng = np.random.default_rng(seed)
    return [
        (
            rng.standard_normal((n_in, n_out), dtype=np.float32) / np.float32(np.sqrt(n_in)),
            rng.standard_normal(n_out, dtype=np.float32) * np.float32(0.1),
        )
        for n_in, n_out in zip(widths[:-1], widths[1:], strict=True)
    ]


def mlp_reference(weights: MlpWeights, x: np.ndarray) -> np.ndarray:
    """The MLP in numpy: ReLU after every layer but the last."""
    y = x.astype(np.float32)
    for index, (w, b) in enumerate(weights):
        y = y @ w + b
        if index < len(weights) - 1:
            y = np.maximum(y, 0)
    return y


def write_mlp(path: Path, weights: MlpWeights, *, name: str = "mlp") -> None:
    """Write the MLP of ``weights`` to ``path`` (a ``model.onnx``; folders created)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = []
    initializers = []
    current = INPUT_NAME
    for index, (w, b) in enumerate(weights):
        initializers += [
            numpy_helper.from_array(w, f"w{index}"),
            numpy_helper.from_array(b, f"b{index}"),
        ]
        is_last = index == len(weights) - 1
        gemm_out = OUTPUT_NAME if is_last else f"gemm{index}"
        nodes.append(helper.make_node("Gemm", [current, f"w{index}", f"b{index}"], [gemm_out]))
        if not is_last:
            nodes.append(helper.make_node("Relu", [gemm_out], [f"relu{index}"]))
            current = f"relu{index}"
    inputs, outputs = int(weights[0][0].shape[0]), int(weights[-1][0].shape[1])
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", inputs])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", outputs])],
        initializer=initializers,
    )
    save_onnx_model(graph, path)


def save_onnx_model(graph: onnx.GraphProto, path: Path) -> None:
    """Check ``graph`` and save it as a model at :data:`ONNX_OPSET` and
    :data:`ONNX_IR_VERSION` (folders created)."""
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = ONNX_IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
