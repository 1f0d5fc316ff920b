"""A small demo model, generated (never downloaded), for ``zeroserve serve --demo``."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import numpy as np

DEMO_MODEL: Final = "demo_mlp"

_CONFIG: Final = """\
name: "demo_mlp"
backend: "onnxruntime"
max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching { }
"""


def write_demo_repository(root: Path) -> Path:
    """Write ``root/demo_mlp`` (a 4 -> 16 -> 3 ONNX MLP with dynamic batching); idempotent."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model_dir = root / DEMO_MODEL
    model_file = model_dir / "1" / "model.onnx"
    if model_file.is_file():
        return model_dir
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((4, 16)).astype(np.float32)
    w2 = rng.standard_normal((16, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["INPUT0", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["OUTPUT0"]),
        ],
        DEMO_MODEL,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model_file.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(model_file))
    (model_dir / "config.pbtxt").write_text(_CONFIG, encoding="utf-8")
    return model_dir
