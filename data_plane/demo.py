"""A small demo model, generated (never downloaded), for ``zeroserve serve --demo``."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from data_plane.mlp import mlp_weights, write_mlp

DEMO_MODEL: Final = "demo_mlp"
DEMO_WIDTHS: Final = (4, 16, 3)
"""The demo MLP's layer widths, input first (:mod:`data_plane.mlp`)."""
DEMO_SEED: Final = 0
"""Its weights are ``mlp_weights(DEMO_WIDTHS, DEMO_SEED)``."""

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
    model_dir = root / DEMO_MODEL
    model_file = model_dir / "1" / "model.onnx"
    if model_file.is_file():
        return model_dir
    write_mlp(model_file, mlp_weights(DEMO_WIDTHS, DEMO_SEED), name=DEMO_MODEL)
    (model_dir / "config.pbtxt").write_text(_CONFIG, encoding="utf-8")
    return model_dir
