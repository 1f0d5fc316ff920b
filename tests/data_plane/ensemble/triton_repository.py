"""A repository of ensembles over Triton Python-backend models (``model.py`` in Triton's
form, unchanged on both servers) for the differential tests against real Triton.

Models: ``scale`` (``OUTPUT0 = INPUT0 * factor``, the factor a config parameter, 2 by
default), ``scale3`` (the same ``model.py``, factor 3), ``add_sub``, ``flat`` (``scale``
without batching), ``scalev`` (versions 1 and 2 both served), ``fail`` (a TritonError
response for negative input), ``failarg`` (an INVALID_ARG response), ``raise`` (execute
raises). Ensembles: ``pipe`` (scale, then add_sub of that and the input, then scale3),
``dag`` (scale and scale3 side by side, joined by add_sub), ``nested`` (``pipe`` as a
step), ``counted`` (a copy of ``pipe`` that only the statistics test calls), ``failing``,
``raising``, ``nestfail`` (``failing`` as a step), ``ens_failarg``, ``versioned`` (both
versions of ``scalev`` as two steps), ``ens_flat``. :data:`BAD` holds ensembles each
load refuses.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

SCALE = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.factor = float(parameters.get("factor", {}).get("string_value", "2"))

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x * self.factor).astype(x.dtype))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""

ADD_SUB = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

FAIL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x < 0).any():
                error = pb_utils.TritonError("negative input")
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

FAIL_ARG = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        error = pb_utils.TritonError("bad arg", pb_utils.TritonError.INVALID_ARG)
        return [pb_utils.InferenceResponse(error=error) for _ in requests]
"""

RAISE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("boom")
"""

ONE = """max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }]
instance_group [{ kind: KIND_CPU }]
"""

TWO = """max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }]
input [{ name: "INPUT1" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [4] }]
instance_group [{ kind: KIND_CPU }]
"""

FLAT = """max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1, 4] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1, 4] }]
instance_group [{ kind: KIND_CPU }]
"""

PYTHON_MODELS: dict[str, tuple[str, str]] = {
    "scale": (SCALE, ONE),
    "scale3": (SCALE, ONE + 'parameters { key: "factor" value: { string_value: "3" } }\n'),
    "add_sub": (ADD_SUB, TWO),
    "flat": (SCALE, FLAT),
    "scalev": (SCALE, ONE + "version_policy { all {} }\n"),
    "fail": (FAIL, ONE),
    "failarg": (FAIL_ARG, ONE),
    "raise": (RAISE, ONE),
}


def step_text(
    model: str, inputs: Mapping[str, str], outputs: Mapping[str, str], version: int = -1
) -> str:
    """A ``step`` of ``ensemble_scheduling``: ``inputs`` and ``outputs`` map the model's
    tensors (keys) to ensemble tensors."""
    maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
    maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
    return f'step {{ model_name: "{model}" model_version: {version} {" ".join(maps)} }}'


def ensemble_text(
    steps: list[str],
    inputs: list[tuple[str, str, str]],
    outputs: list[tuple[str, str, str]],
    *,
    max_batch_size: int = 8,
) -> str:
    """An ensemble's config without its name; tensors as ``(name, TYPE_*, dims)``."""

    def tensors(items: list[tuple[str, str, str]]) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: {t} dims: [{d}] }}' for n, t, d in items)

    return (
        f'platform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
        f"input [{tensors(inputs)}]\noutput [{tensors(outputs)}]\n"
        f"ensemble_scheduling {{ {' '.join(steps)} }}\n"
    )


F = "TYPE_FP32"
IN = [("IN", F, "4")]
OUT = [("OUT", F, "4")]
PIPE = ensemble_text(
    [
        step_text("scale", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
        step_text("add_sub", {"INPUT0": "a", "INPUT1": "IN"}, {"OUTPUT0": "s", "OUTPUT1": "D"}),
        step_text("scale3", {"INPUT0": "s"}, {"OUTPUT0": "OUT"}),
    ],
    IN,
    [("OUT", F, "4"), ("D", F, "4")],
)

ENSEMBLES: dict[str, str] = {
    "pipe": PIPE,
    "counted": PIPE,
    "dag": ensemble_text(
        [
            step_text("scale", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
            step_text("scale3", {"INPUT0": "IN"}, {"OUTPUT0": "b"}),
            step_text(
                "add_sub", {"INPUT0": "a", "INPUT1": "b"}, {"OUTPUT0": "OUT0", "OUTPUT1": "OUT1"}
            ),
        ],
        IN,
        [("OUT0", F, "4"), ("OUT1", F, "4")],
    ),
    "nested": ensemble_text(
        [
            step_text("pipe", {"IN": "X"}, {"OUT": "y", "D": "Z2"}),
            step_text("scale", {"INPUT0": "y"}, {"OUTPUT0": "Z"}),
        ],
        [("X", F, "4")],
        [("Z", F, "4"), ("Z2", F, "4")],
    ),
    "failing": ensemble_text(
        [
            step_text("scale", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
            step_text("fail", {"INPUT0": "a"}, {"OUTPUT0": "OUT"}),
        ],
        IN,
        OUT,
    ),
    "raising": ensemble_text([step_text("raise", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], IN, OUT),
    "nestfail": ensemble_text(
        [step_text("failing", {"IN": "X"}, {"OUT": "Z"})], [("X", F, "4")], [("Z", F, "4")]
    ),
    "ens_failarg": ensemble_text(
        [step_text("failarg", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], IN, OUT
    ),
    "versioned": ensemble_text(
        [
            step_text("scalev", {"INPUT0": "IN"}, {"OUTPUT0": "a"}, version=1),
            step_text("scalev", {"INPUT0": "a"}, {"OUTPUT0": "OUT"}, version=2),
        ],
        IN,
        OUT,
    ),
    "ens_flat": ensemble_text([step_text("flat", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], IN, OUT),
}

STARTUP = sorted(ENSEMBLES)
"""The ensembles both servers load at start (their composing models come with them)."""

BAD: dict[str, str] = {
    # Refused once the composing models are known: Triton answers 400 with its reason.
    "bad_missing_model": ensemble_text(
        [step_text("nosuch", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], IN, OUT
    ),
    "bad_missing_version": ensemble_text(
        [step_text("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}, version=7)], IN, OUT
    ),
    "bad_misnamed_input": ensemble_text(
        [step_text("scale", {"WRONG": "IN"}, {"OUTPUT0": "OUT"})], IN, OUT
    ),
    "bad_misnamed_output": ensemble_text(
        [step_text("scale", {"INPUT0": "IN"}, {"WRONG": "OUT"})], IN, OUT
    ),
    "bad_step_input_unmapped": ensemble_text(
        [step_text("add_sub", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], IN, OUT
    ),
    "bad_dtype": ensemble_text(
        [step_text("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], [("IN", "TYPE_INT32", "4")], OUT
    ),
    "bad_shape": ensemble_text(
        [step_text("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], IN, [("OUT", F, "3")]
    ),
    "bad_batch": ensemble_text(
        [step_text("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], IN, OUT, max_batch_size=16
    ),
    "bad_self_ref": ensemble_text(
        [step_text("bad_self_ref", {"IN": "IN"}, {"OUT": "OUT"})], IN, OUT
    ),
    "cyc_a": ensemble_text([step_text("cyc_b", {"IN": "IN"}, {"OUT": "OUT"})], IN, OUT),
    "cyc_b": ensemble_text([step_text("cyc_a", {"IN": "IN"}, {"OUT": "OUT"})], IN, OUT),
    # Refused from the config alone: Triton only logs the reason.
    "poll_cycle": ensemble_text(
        [
            step_text("scale", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
            step_text(
                "add_sub", {"INPUT0": "a", "INPUT1": "c"}, {"OUTPUT0": "b", "OUTPUT1": "OUT"}
            ),
            step_text("scale3", {"INPUT0": "b"}, {"OUTPUT0": "c"}),
        ],
        IN,
        OUT,
    ),
    "poll_unmapped": ensemble_text(
        [step_text("scale", {"INPUT0": "nowhere"}, {"OUTPUT0": "OUT"})], IN, OUT
    ),
    "poll_unused_input": ensemble_text(
        [step_text("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], [*IN, ("EXTRA", F, "4")], OUT
    ),
    "poll_unwritten_output": ensemble_text(
        [step_text("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], IN, [*OUT, ("OUT2", F, "4")]
    ),
    "poll_written_twice": ensemble_text(
        [
            step_text("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
            step_text("scale3", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
        ],
        IN,
        OUT,
    ),
}


def write_repository(repo: Path) -> Path:
    """Every model above in ``repo`` (an ensemble's version folder is empty, as Triton's
    layout has it)."""
    for name, (source, config) in PYTHON_MODELS.items():
        versions = (1, 2) if name == "scalev" else (1,)
        for version in versions:
            (repo / name / str(version)).mkdir(parents=True, exist_ok=True)
            (repo / name / str(version) / "model.py").write_text(source)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')
    for name, config in {**ENSEMBLES, **BAD}.items():
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    return repo
