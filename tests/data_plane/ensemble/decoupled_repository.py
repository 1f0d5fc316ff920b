"""A repository of ensembles with decoupled steps, over Triton Python-backend models
(``model.py`` in Triton's form, unchanged on both servers), for the differential test
against real Triton.

Models: Triton's ``square_int32`` and ``repeat_int32`` examples and ``decoupled_errors``
(whose execute raises for a negative count), from the streaming tests, and ``plus1``
(plain, not decoupled: ``OUTPUT0 = INPUT0 + 1``, an error response for a negative
input). Ensembles: ``ens_square`` (square_int32, then plus1 of each response),
``ens_chain`` (square_int32 twice: N responses, each answered N times), ``ens_nested``
(``ens_square`` as a step, then plus1), ``ens_raises`` (decoupled_errors, then plus1),
``ens_repeat`` (repeat_int32, then plus1: a negative value fails in the middle of the
stream), and ``ens_mixed``, whose outputs come from a decoupled and a plain branch, which
Triton refuses to load.
"""

from __future__ import annotations

from pathlib import Path

from tests.data_plane.ensemble.triton_repository import ensemble_text, step_text
from tests.runtimes.python_backend.streaming_models import (
    write_repository as write_streaming_models,
)

PLUS1 = """
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x < 0).any():
                error = pb_utils.TritonError("negative input")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            out = pb_utils.Tensor("OUTPUT0", (x + 1).astype(np.int32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""

PLUS1_CONFIG = """name: "plus1"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [1] }]
instance_group [{ kind: KIND_CPU }]
"""


INT32 = "TYPE_INT32"
IN = [("IN", INT32, "1")]
OUT = [("OUT", INT32, "1")]
PLUS1_STEP = step_text("plus1", {"INPUT0": "a"}, {"OUTPUT0": "OUT"})


def _chain(first: str, inputs: dict[str, str], second: str = PLUS1_STEP) -> str:
    """``first`` (its output OUT to ``a``), then ``second`` reading ``a``."""
    return ensemble_text(
        [step_text(first, inputs, {"OUT": "a"}), second], IN, OUT, max_batch_size=0
    )


ENSEMBLES = {
    "ens_square": _chain("square_int32", {"IN": "IN"}),
    "ens_chain": _chain(
        "square_int32", {"IN": "IN"}, step_text("square_int32", {"IN": "a"}, {"OUT": "OUT"})
    ),
    "ens_nested": _chain("ens_square", {"IN": "IN"}),
    "ens_raises": _chain("decoupled_errors", {"IN": "IN"}),
    "ens_repeat": ensemble_text(
        [
            step_text("repeat_int32", {"IN": "IN", "DELAY": "DELAY", "WAIT": "WAIT"}, {"OUT": "a"}),
            PLUS1_STEP,
        ],
        [("IN", INT32, "-1"), ("DELAY", "TYPE_UINT32", "-1"), ("WAIT", "TYPE_UINT32", "1")],
        OUT,
        max_batch_size=0,
    ),
}
"""Loaded at start by both servers (their composing models come with them)."""

MIXED = ensemble_text(
    [
        step_text("square_int32", {"IN": "IN"}, {"OUT": "OA"}),
        step_text("plus1", {"INPUT0": "IN"}, {"OUTPUT0": "OB"}),
    ],
    IN,
    [("OA", INT32, "1"), ("OB", INT32, "1")],
    max_batch_size=0,
)


def write_repository(repo: Path) -> Path:
    """Every model above in ``repo``."""
    write_streaming_models(repo, ["square_int32", "repeat_int32", "decoupled_errors"])
    (repo / "plus1" / "1").mkdir(parents=True)
    (repo / "plus1" / "config.pbtxt").write_text(PLUS1_CONFIG)
    (repo / "plus1" / "1" / "model.py").write_text(PLUS1)
    for name, config in {**ENSEMBLES, "ens_mixed": MIXED}.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    return repo
