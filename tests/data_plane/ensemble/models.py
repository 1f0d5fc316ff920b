"""A repository of ensembles over zeroserve Python models (the dict contract, in process)
and ONNX models, for the in-process tests.

``classify``: ``pre`` (uint8 pixels to floats in [0, 1]) -> ``mlp`` (ONNX) -> ``post``
(softmax and arg-max). ``branches``: ``double`` and ``triple`` of the input, side by side,
then ``add_sub`` (ONNX) of the two. ``outer``: ``classify`` as a step (an ensemble of
ensembles) beside ``negate`` of its probabilities. ``guarded``: ``check`` (refuses negative
values) -> ``double``. ``shapeless``: variable dims feeding ``mlp``, so a wrong size fails
at the composing model.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from foundation.proto import model_config_pb2 as mc
from tests.data_plane.ensemble.ensembles import ensemble_config, step, write_ensemble
from tests.models import (
    load_mlp_weights,
    make_config,
    mlp_reference,
    read_config,
    write_config,
    write_onnx_add_sub,
    write_onnx_mlp,
)

PIXELS = 16
CLASSES = 8

PRE = """\
import numpy as np


class TritonPythonModel:
    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"].astype(np.float32) / 255.0}
"""

POST = """\
import numpy as np


class TritonPythonModel:
    def execute(self, inputs):
        logits = inputs["INPUT0"]
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        return {
            "PROB": (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32),
            "LABEL": logits.argmax(axis=1).astype(np.int64).reshape(-1, 1),
        }
"""

SCALE = """\
class TritonPythonModel:
    def execute(self, inputs):
        return {{"OUTPUT0": inputs["INPUT0"] * {factor}}}
"""

CHECK = """\
from data_plane.errors import InvalidArgumentError


class TritonPythonModel:
    def execute(self, inputs):
        if (inputs["INPUT0"] < 0).any():
            raise InvalidArgumentError("negative input")
        return {"OUTPUT0": inputs["INPUT0"]}
"""

Tensor = tuple[str, str, Sequence[int]]


def write_dict_model(
    repo: Path,
    name: str,
    source: str,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    *,
    dynamic_batching: bool = False,
) -> Path:
    """A zeroserve dict-contract ``model.py`` with the given tensors (batching, max 8)."""
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(source))
    write_config(
        model_dir,
        make_config(
            name,
            backend="python",
            dynamic_batching=dynamic_batching,
            inputs=inputs,
            outputs=outputs,
        ),
    )
    return model_dir


def write_repository(repo: Path, *, mlp_batching: mc.ModelDynamicBatching | None = None) -> Path:
    """Every model and ensemble above, in ``repo``; ``mlp_batching`` replaces the MLP's
    ``dynamic_batching``."""
    write_dict_model(
        repo, "pre", PRE, [("INPUT0", "UINT8", [PIXELS])], [("OUTPUT0", "FP32", [PIXELS])]
    )
    mlp = write_onnx_mlp(repo, "mlp", sizes=(PIXELS, 32, CLASSES))
    if mlp_batching is not None:
        config = read_config(mlp)
        config.dynamic_batching.CopyFrom(mlp_batching)
        write_config(mlp, config)
    write_dict_model(
        repo,
        "post",
        POST,
        [("INPUT0", "FP32", [CLASSES])],
        [("PROB", "FP32", [CLASSES]), ("LABEL", "INT64", [1])],
    )
    for name, factor in (("double", 2), ("triple", 3), ("negate", -1)):
        dims = [CLASSES] if name == "negate" else [PIXELS]
        write_dict_model(
            repo,
            name,
            SCALE.format(factor=factor),
            [("INPUT0", "FP32", dims)],
            [("OUTPUT0", "FP32", dims)],
        )
    write_dict_model(
        repo, "check", CHECK, [("INPUT0", "FP32", [PIXELS])], [("OUTPUT0", "FP32", [PIXELS])]
    )
    write_onnx_add_sub(repo, "add_sub", dims=(PIXELS,))
    write_ensemble(
        repo,
        ensemble_config(
            "classify",
            [
                step("pre", {"INPUT0": "IMAGE"}, {"OUTPUT0": "pixels"}),
                step("mlp", {"INPUT0": "pixels"}, {"OUTPUT0": "logits"}),
                step("post", {"INPUT0": "logits"}, {"PROB": "PROB", "LABEL": "LABEL"}),
            ],
            [("IMAGE", "UINT8", [PIXELS])],
            [("LABEL", "INT64", [1]), ("PROB", "FP32", [CLASSES])],
        ),
    )
    write_ensemble(
        repo,
        ensemble_config(
            "branches",
            [
                step("double", {"INPUT0": "IN"}, {"OUTPUT0": "twice"}),
                step("triple", {"INPUT0": "IN"}, {"OUTPUT0": "thrice"}),
                step(
                    "add_sub",
                    {"INPUT0": "twice", "INPUT1": "thrice"},
                    {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"},
                ),
            ],
            [("IN", "FP32", [PIXELS])],
            [("SUM", "FP32", [PIXELS]), ("DIFF", "FP32", [PIXELS])],
        ),
    )
    write_ensemble(
        repo,
        ensemble_config(
            "outer",
            [
                step("classify", {"IMAGE": "IMAGE"}, {"LABEL": "LABEL", "PROB": "prob"}),
                step("negate", {"INPUT0": "prob"}, {"OUTPUT0": "NEG"}),
            ],
            [("IMAGE", "UINT8", [PIXELS])],
            [("LABEL", "INT64", [1]), ("NEG", "FP32", [CLASSES])],
        ),
    )
    write_ensemble(
        repo,
        ensemble_config(
            "guarded",
            [
                step("check", {"INPUT0": "IN"}, {"OUTPUT0": "checked"}),
                step("double", {"INPUT0": "checked"}, {"OUTPUT0": "OUT"}),
            ],
            [("IN", "FP32", [PIXELS])],
            [("OUT", "FP32", [PIXELS])],
        ),
    )
    write_ensemble(
        repo,
        ensemble_config(
            "shapeless",
            [step("mlp", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})],
            [("IN", "FP32", [-1])],
            [("OUT", "FP32", [-1])],
        ),
    )
    return repo


def classify_reference(repo: Path, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What ``classify`` answers for ``image`` (uint8, ``[batch, PIXELS]``): labels
    ``[batch, 1]`` and probabilities, computed in numpy."""
    logits = mlp_reference(load_mlp_weights(repo / "mlp"), image.astype(np.float32) / 255.0)
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return logits.argmax(axis=1).reshape(-1, 1), shifted / shifted.sum(axis=1, keepdims=True)
