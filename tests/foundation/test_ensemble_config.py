"""Triton's checks of an ensemble's own config, with the texts Triton 2.51 logged for the
same configs ("Poll failed for model directory ..."), and the steps read from it."""

from __future__ import annotations

import pytest

from foundation import ensemble_config, model_config
from foundation.proto import model_config_pb2 as mc
from tests.data_plane.ensemble.ensembles import ensemble_config as make, step

IN = ("IN", "FP32", [4])
OUT = ("OUT", "FP32", [4])


def _normalized(config: mc.ModelConfig) -> None:
    model_config.normalize(config, name=config.name, gpu_count=0)


def _bad(name: str, steps, inputs=(IN,), outputs=(OUT,)) -> mc.ModelConfig:
    return make(name, steps, inputs, outputs)


CASES = [
    pytest.param(
        _bad(
            "e",
            [
                step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
                step("add_sub", {"INPUT0": "a", "INPUT1": "c"}, {"OUTPUT0": "b", "OUTPUT1": "OUT"}),
                step("scale3", {"INPUT0": "b"}, {"OUTPUT0": "c"}),
            ],
        ),
        "output 'OUT' for ensemble 'e' is not written: at least one of its depending tensors, "
        "'b', is not connected",
        id="cycle",
    ),
    pytest.param(
        _bad("e", [step("scale", {"INPUT0": "nowhere"}, {"OUTPUT0": "OUT"})]),
        "ensemble input 'IN' for ensemble e' is not used",
        id="unmapped-tensor",
    ),
    pytest.param(
        _bad(
            "e",
            [step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})],
            inputs=(IN, ("EXTRA", "FP32", [4])),
        ),
        "ensemble input 'EXTRA' for ensemble e' is not used",
        id="input-not-read",
    ),
    pytest.param(
        _bad(
            "e",
            [step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})],
            outputs=(OUT, ("OUT2", "FP32", [4])),
        ),
        "ensemble output 'OUT2' for ensemble e' is not used",
        id="output-not-written",
    ),
    pytest.param(
        _bad(
            "e",
            [
                step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
                step("scale3", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
            ],
        ),
        "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'e' step 1",
        id="written-twice",
    ),
    pytest.param(
        _bad(
            "e",
            [
                step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
                step("scale3", {"INPUT0": "IN"}, {"OUTPUT0": "dead_end"}),
            ],
        ),
        "ensemble tensor 'dead_end' is unused in ensemble 'e'",
        id="tensor-read-by-nobody",
    ),
    pytest.param(_bad("e", []), "must specify 'step' for ensemble 'e'", id="no-steps"),
    pytest.param(
        _bad("e", [step("", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]),
        "must specify 'model_name' in step 0 of ensemble 'e'",
        id="no-model-name",
    ),
    pytest.param(
        _bad("e", [step("scale", {}, {"OUTPUT0": "OUT"})]),
        "must specify 'input_map' in step 0 of ensemble 'e'",
        id="no-input-map",
    ),
    pytest.param(
        _bad(
            "e",
            [
                step("scale", {"INPUT0": "IN"}, {}),
                step("scale3", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
            ],
        ),
        "must specify 'output_map' in step 0 of ensemble 'e'",
        id="no-output-map",
    ),
]


@pytest.mark.parametrize(("config", "text"), CASES)
def test_triton_refuses_these_ensembles_with_these_texts(config: mc.ModelConfig, text: str):
    with pytest.raises(model_config.ConfigError) as refused:
        _normalized(config)

    assert str(refused.value) == text


def test_an_ensemble_takes_no_instance_group():
    config = _bad("e", [step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})])
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)

    with pytest.raises(
        model_config.ConfigError, match=r"^instance group should not be specified for ensemble 'e'$"
    ):
        _normalized(config)


@pytest.mark.parametrize(
    ("edit", "text"),
    [
        pytest.param(
            lambda c: c.optimization.input_pinned_memory.SetInParent(),
            "optimization should not be specified for ensemble 'e'",
            id="optimization",
        ),
        pytest.param(
            lambda c: c.model_warmup.add(name="w"),
            "model_warmup can not be specified for ensemble 'e'",
            id="warmup",
        ),
        pytest.param(
            lambda c: c.ClearField("ensemble_scheduling"),
            "ensemble scheduling must be set for ensemble e whose platform is ensemble",
            id="platform-without-steps",
        ),
        pytest.param(
            lambda c: setattr(c, "platform", "onnxruntime_onnx"),
            "ensemble scheduling cannot be set for model 'e' whose platform is not ensemble",
            id="steps-without-platform",
        ),
    ],
)
def test_fields_an_ensemble_refuses(edit, text: str):
    config = _bad("e", [step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})])
    edit(config)

    with pytest.raises(model_config.ConfigError) as refused:
        _normalized(config)

    assert str(refused.value) == text


def test_a_valid_ensemble_is_normalized_without_instances_or_pinned_memory():
    config = _bad(
        "e",
        [
            step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
            step("add_sub", {"INPUT0": "a", "INPUT1": "IN"}, {"OUTPUT0": "OUT", "OUTPUT1": "D"}),
        ],
        outputs=(OUT, ("D", "FP32", [4])),
    )

    _normalized(config)

    assert not config.instance_group
    assert not config.HasField("optimization")
    assert config.version_policy.latest.num_versions == 1
    assert ensemble_config.is_ensemble(config)


def test_steps_and_composing_models_read_from_the_config():
    config = _bad(
        "e",
        [
            step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "a"}, version=2),
            step("scale", {"INPUT0": "a"}, {"OUTPUT0": "b"}),
            step("post", {"X": "b"}, {"Y": "OUT"}),
        ],
    )

    steps = ensemble_config.steps_of(config)

    assert ensemble_config.composing_models(config) == ("scale", "post")
    assert [(s.index, s.model, s.version) for s in steps] == [
        (0, "scale", 2),
        (1, "scale", None),
        (2, "post", None),
    ]
    assert steps[2].inputs == (("X", "b"),)
    assert steps[2].outputs == (("Y", "OUT"),)


def test_an_ensemble_input_that_a_step_writes_again_is_accepted_as_triton_does():
    config = _bad("e", [step("scale", {"INPUT0": "IN"}, {"OUTPUT0": "IN"})], outputs=(IN,))

    _normalized(config)
