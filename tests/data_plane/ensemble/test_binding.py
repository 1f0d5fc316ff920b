"""An ensemble checked against its composing models' configs, with the texts Triton 2.51
answered for the same repository ("load failed for model ..."), and the steps it binds."""

from __future__ import annotations

import pytest

from data_plane.ensemble.binding import EnsembleBindingError, bind_steps, is_decoupled
from foundation.proto import model_config_pb2 as mc
from tests.data_plane.ensemble.ensembles import ensemble_config, step
from tests.models import make_config

F = "FP32"
COMPOSING = {
    "scale": make_config("scale", inputs=[("INPUT0", F, [4])], outputs=[("OUTPUT0", F, [4])]),
    "add_sub": make_config(
        "add_sub",
        inputs=[("INPUT0", F, [4]), ("INPUT1", F, [4])],
        outputs=[("OUTPUT0", F, [4]), ("OUTPUT1", F, [4])],
    ),
    "flat": make_config(
        "flat",
        max_batch_size=0,
        inputs=[("INPUT0", F, [-1, 4])],
        outputs=[("OUTPUT0", F, [-1, 4])],
    ),
    "optional": make_config(
        "optional",
        inputs=[("INPUT0", F, [4]), ("EXTRA", F, [4])],
        outputs=[("OUTPUT0", F, [4])],
    ),
}
COMPOSING["optional"].input[1].optional = True


def composing(name: str, version: int | None) -> mc.ModelConfig:
    return COMPOSING[name]


def one_step(
    model: str,
    inputs: dict[str, str],
    outputs: dict[str, str],
    *,
    ins=(("IN", F, [4]),),
    outs=(("OUT", F, [4]),),
    max_batch_size: int = 8,
) -> mc.ModelConfig:
    return ensemble_config(
        "e", [step(model, inputs, outputs)], ins, outs, max_batch_size=max_batch_size
    )


@pytest.mark.parametrize(
    ("config", "text"),
    [
        pytest.param(
            one_step("scale", {"WRONG": "IN"}, {"OUTPUT0": "OUT"}),
            "in ensemble e, ensemble tensor IN is mapping to non-existing input WRONG in model "
            "scale",
            id="misnamed-input",
        ),
        pytest.param(
            one_step("scale", {"INPUT0": "IN"}, {"WRONG": "OUT"}),
            "in ensemble e, ensemble tensor OUT is mapped from non-existing output WRONG in "
            "model scale",
            id="misnamed-output",
        ),
        pytest.param(
            one_step("add_sub", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
            "in ensemble e, input INPUT1 in model add_sub is not mapped to any ensemble tensors",
            id="input-not-fed",
        ),
        pytest.param(
            one_step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}, ins=(("IN", "INT32", [4]),)),
            "in ensemble e, ensemble tensor IN: inconsistent data type: TYPE_INT32 is inferred "
            "from model e while TYPE_FP32 is inferred from model scale",
            id="input-datatype",
        ),
        pytest.param(
            one_step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}, outs=(("OUT", "INT64", [4]),)),
            "in ensemble e, ensemble tensor OUT: inconsistent data type: TYPE_INT64 is inferred "
            "from model e while TYPE_FP32 is inferred from model scale",
            id="output-datatype",
        ),
        pytest.param(
            one_step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}, ins=(("IN", F, [5]),)),
            "in ensemble e, ensemble tensor IN: inconsistent shape: [-1,5] is inferred from "
            "model e while [-1,4] is inferred from model scale",
            id="input-shape",
        ),
        pytest.param(
            one_step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}, outs=(("OUT", F, [3]),)),
            "in ensemble e, ensemble tensor OUT: inconsistent shape: [-1,3] is inferred from "
            "model e while [-1,4] is inferred from model scale",
            id="output-shape",
        ),
        pytest.param(
            one_step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}, max_batch_size=16),
            "ensemble e allows maximum batch size 16, but it contains model scale which only "
            "allows maximum batch size to be 8",
            id="batch-size",
        ),
    ],
)
def test_triton_refuses_these_ensembles_with_these_texts(config: mc.ModelConfig, text: str):
    with pytest.raises(EnsembleBindingError) as refused:
        bind_steps(config, composing)

    assert str(refused.value) == text


def _decoupled(name: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    config.CopyFrom(COMPOSING[name])
    config.name = f"{name}_stream"
    config.model_transaction_policy.decoupled = True
    return config


COMPOSING["scale_stream"] = _decoupled("scale")
COMPOSING["add_sub_stream"] = _decoupled("add_sub")

SCALE_IN_OUT = [("IN", F, [4])], [("OUT", F, [4])]


@pytest.mark.parametrize(
    ("steps", "outputs", "decoupled"),
    [
        pytest.param(
            [
                step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
                step("scale", {"INPUT0": "a"}, {"OUTPUT0": "OUT"}),
            ],
            [("OUT", F, [4])],
            False,
            id="no-decoupled-step",
        ),
        pytest.param(
            [
                step("scale_stream", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
                step("scale", {"INPUT0": "a"}, {"OUTPUT0": "OUT"}),
            ],
            [("OUT", F, [4])],
            True,
            id="decoupled-then-plain",
        ),
        pytest.param(
            [
                step("scale_stream", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
                step("scale_stream", {"INPUT0": "a"}, {"OUTPUT0": "OUT"}),
            ],
            [("OUT", F, [4])],
            True,
            id="two-decoupled-in-a-chain",
        ),
        pytest.param(
            [
                step(
                    "add_sub_stream",
                    {"INPUT0": "IN", "INPUT1": "IN"},
                    {"OUTPUT0": "a", "OUTPUT1": "b"},
                ),
                step("add_sub", {"INPUT0": "a", "INPUT1": "b"}, {"OUTPUT0": "OUT", "OUTPUT1": "D"}),
            ],
            [("OUT", F, [4]), ("D", F, [4])],
            True,
            id="sibling-outputs-join",
        ),
    ],
)
def test_an_ensemble_is_decoupled_when_a_step_is(steps, outputs, decoupled: bool):
    config = ensemble_config("e", steps, [("IN", F, [4])], outputs)

    assert is_decoupled(config, bind_steps(config, composing)) is decoupled


@pytest.mark.parametrize(
    ("steps", "outputs", "model"),
    [
        pytest.param(
            [
                step("scale_stream", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
                step(
                    "add_sub", {"INPUT0": "a", "INPUT1": "IN"}, {"OUTPUT0": "OUT", "OUTPUT1": "D"}
                ),
            ],
            [("OUT", F, [4]), ("D", F, [4])],
            "e",
            id="a-step-reads-a-decoupled-and-a-plain-tensor",
        ),
        pytest.param(
            [
                step("scale_stream", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
                step("scale_stream", {"INPUT0": "IN"}, {"OUTPUT0": "b"}),
                step("add_sub", {"INPUT0": "a", "INPUT1": "b"}, {"OUTPUT0": "c", "OUTPUT1": "x"}),
                step("scale", {"INPUT0": "c"}, {"OUTPUT0": "OUT"}),
            ],
            [("OUT", F, [4])],
            "add_sub",
            id="a-step-reads-two-decoupled-steps",
        ),
        pytest.param(
            [
                step("scale_stream", {"INPUT0": "IN"}, {"OUTPUT0": "OA"}),
                step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OB"}),
            ],
            [("OA", F, [4]), ("OB", F, [4])],
            "e",
            id="outputs-from-a-decoupled-and-a-plain-branch",
        ),
    ],
)
def test_mixing_decoupled_origins_is_refused_with_tritons_text(steps, outputs, model: str):
    """The last case is Triton 2.51's answer to the differential test's ``ens_dag``."""
    config = ensemble_config("e", steps, [("IN", F, [4])], outputs)

    with pytest.raises(EnsembleBindingError) as refused:
        is_decoupled(config, bind_steps(config, composing))

    assert str(refused.value) == (
        f"in ensemble e, step of model '{model}' receives inputs originated from different "
        "decoupled models"
    )


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(
            one_step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}, ins=(("IN", F, [-1]),)),
            id="variable-dims",
        ),
        pytest.param(
            one_step("flat", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}), id="non-batching-step"
        ),
        pytest.param(
            one_step("optional", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}), id="optional-left-out"
        ),
        pytest.param(
            one_step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}, max_batch_size=4),
            id="smaller-batch",
        ),
    ],
)
def test_ensembles_triton_accepts_bind(config: mc.ModelConfig):
    (bound,) = bind_steps(config, composing)

    assert bound.inputs[0][1] == "IN"
    assert [o.name for o in bound.requested] == [name for name, _ in bound.outputs]


def test_steps_bind_in_order_with_their_versions():
    config = ensemble_config(
        "e",
        [
            step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "a"}, version=3),
            step("add_sub", {"INPUT0": "a", "INPUT1": "IN"}, {"OUTPUT0": "OUT", "OUTPUT1": "D"}),
        ],
        [("IN", F, [4])],
        [("OUT", F, [4]), ("D", F, [4])],
    )
    asked: list[tuple[str, int | None]] = []

    def recording(name: str, version: int | None) -> mc.ModelConfig:
        asked.append((name, version))
        return COMPOSING[name]

    steps = bind_steps(config, recording)

    assert asked == [("scale", 3), ("add_sub", None)]
    assert [(s.index, s.model, s.version) for s in steps] == [(0, "scale", 3), (1, "add_sub", None)]
    # Protobuf maps keep no order.
    assert sorted(steps[1].outputs) == [("OUTPUT0", "OUT"), ("OUTPUT1", "D")]
