"""``sequence_batching`` at load: Triton's checks with its texts (each observed on Triton 2.51
as the reason of "failed to poll from model repository"), its defaults, zeroserve's refusals
where Triton loads a config it then serves wrongly, and the tensors the batcher adds."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from foundation import model_config
from foundation.proto.model_config_pb2 import ModelConfig
from foundation.sequence_config import (
    SequenceConfigError,
    normalize_sequence_batching,
    sequence_inputs,
    sequence_outputs,
)

BASE = """
name: "acc"
max_batch_size: 2
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def config(sequence: str, *, base: str = BASE) -> ModelConfig:
    return text_format.Parse(base + f"sequence_batching {{ {sequence} }}", ModelConfig())


def control(name: str, body: str) -> str:
    return f'{{ name: "{name}" control [ {{ {body} }} ] }}'


START_I32 = "kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]"
READY_3 = "kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1, 2]"
CORRID_FP32 = "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32"
CORRID_VALUES = "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 int32_false_true: [0, 1]"


@pytest.mark.parametrize(
    ("sequence", "text"),
    [
        pytest.param(
            f"control_input [ {{ control [ {{ {START_I32} }} ] }} ]",
            "sequence batching control tensor must have a name for acc",
            id="no-name",
        ),
        pytest.param(
            f"control_input [ {control('A', START_I32)}, "
            f"{control('A', 'kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1]')} ]",
            "sequence batching control tensor 'A' is specified for multiple control kinds for acc",
            id="tensor-twice",
        ),
        pytest.param(
            f"control_input [ {control('A', START_I32)}, {control('B', START_I32)} ]",
            "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for acc",
            id="kind-twice",
        ),
        pytest.param(
            f"control_input [ {control('A', 'kind: CONTROL_SEQUENCE_START')} ]",
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            "'bool_false_true' for CONTROL_SEQUENCE_START for acc",
            id="no-values",
        ),
        pytest.param(
            f"control_input [ {control('A', START_I32 + ' fp32_false_true: [0, 1]')} ]",
            "sequence batching specifies more than one from 'int32_false_true', "
            "'fp32_false_true' and 'bool_false_true' for CONTROL_SEQUENCE_START for acc",
            id="two-forms",
        ),
        pytest.param(
            f"control_input [ {control('A', READY_3)} ]",
            "sequence batching control 'int32_false_true' must have exactly 2 entries for "
            "CONTROL_SEQUENCE_READY for acc",
            id="three-values",
        ),
        pytest.param(
            f"control_input [ {control('A', CORRID_FP32)} ]",
            "unexpected data type for control CONTROL_SEQUENCE_CORRID for acc. Allowed data "
            "types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
            id="corrid-float",
        ),
        pytest.param(
            f"control_input [ {control('A', CORRID_VALUES)} ]",
            "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' "
            "or 'bool_false_true' for CONTROL_SEQUENCE_CORRID for acc",
            id="corrid-with-values",
        ),
        pytest.param(
            "oldest { preferred_batch_size: [ 3 ] }",
            "sequence batching preferred batch size must be <= max batch size for acc",
            id="preferred-too-big",
        ),
        pytest.param(
            "oldest { preferred_batch_size: [ 0 ] }",
            "sequence batching preferred batch size must be positive for acc",
            id="preferred-zero",
        ),
        pytest.param(
            "direct { minimum_slot_utilization: 1.5 }",
            "sequence batching minimum slot utilization must be in range (0.0, 1.0] for acc",
            id="utilization",
        ),
    ],
)
def test_tritons_checks_and_texts(sequence: str, text: str) -> None:
    with pytest.raises(SequenceConfigError) as caught:
        normalize_sequence_batching(config(sequence))
    assert str(caught.value) == text


@pytest.mark.parametrize(
    ("sequence", "fragment"),
    [
        pytest.param("iterative_sequence: true", "iterative sequences", id="iterative"),
        pytest.param(
            f"control_input [ {control('INPUT', START_I32)} ]",
            "control tensor 'INPUT' of model 'acc' is also a configured input",
            id="control-is-an-input",
        ),
        pytest.param(
            'state [ { output_name: "SO" data_type: TYPE_INT32 dims: [1] } ]',
            "must have an 'input_name' and an 'output_name'",
            id="state-without-input-name",
        ),
        pytest.param(
            'state [ { input_name: "INPUT" output_name: "SO" data_type: TYPE_INT32 dims: [1] } ]',
            "state input 'INPUT' of model 'acc' is also a configured or control input",
            id="state-is-an-input",
        ),
        pytest.param(
            'state [ { input_name: "S" output_name: "SO" dims: [1] } ]',
            "must have a 'data_type'",
            id="state-without-datatype",
        ),
        pytest.param(
            'state [ { input_name: "S" output_name: "SO" data_type: TYPE_INT32 dims: [1] '
            'initial_state [ { data_type: TYPE_INT32 dims: [1] data_file: "../x" name: "a" } ] } ]',
            "must be the name of a file in its initial_state folder",
            id="initial-state-file-is-a-path",
        ),
    ],
)
def test_zeroserve_refuses_what_triton_serves_wrongly(sequence: str, fragment: str) -> None:
    with pytest.raises(SequenceConfigError, match=fragment):
        normalize_sequence_batching(config(sequence))


def test_defaults_as_triton_prints_them() -> None:
    checked = config("oldest { max_candidate_sequences: 2 }")
    normalize_sequence_batching(checked)
    assert checked.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(checked.sequence_batching.oldest.preferred_batch_size) == [2]
    kept = config("max_sequence_idle_microseconds: 5 direct { }")
    normalize_sequence_batching(kept)
    assert kept.sequence_batching.max_sequence_idle_microseconds == 5


def test_normalize_lets_sequence_models_load_and_words_errors_as_poll_reasons() -> None:
    good = config(f"control_input [ {control('S', START_I32)} ]")
    model_config.normalize(good, name="acc", gpu_count=0)
    assert good.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    with pytest.raises(model_config.ConfigError, match="must have a name for acc"):
        model_config.normalize(
            config(f"control_input [ {{ control [ {{ {START_I32} }} ] }} ]"),
            name="acc",
            gpu_count=0,
        )


def test_the_tensors_the_batcher_adds() -> None:
    checked = config(
        f"control_input [ {control('S', START_I32)}, "
        f"{control('R', 'kind: CONTROL_SEQUENCE_READY bool_false_true: [false, true]')}, "
        f"{control('C', 'kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING')} ] "
        'state [ { input_name: "SI" output_name: "SO" data_type: TYPE_FP32 dims: [2, -1] }, '
        '{ input_name: "SI" output_name: "SO2" data_type: TYPE_FP32 dims: [1] } ]'
    )
    normalize_sequence_batching(checked)
    inputs = [
        (t.name, ModelConfig.DESCRIPTOR.fields_by_name, t.data_type, list(t.dims))
        for t in sequence_inputs(checked)
    ]
    assert [(name, dtype, dims) for name, _, dtype, dims in inputs] == [
        ("S", 8, [1]),
        ("R", 1, [1]),
        ("C", 13, [1]),
        ("SI", 11, [2, -1]),
    ]
    assert [(t.name, list(t.dims)) for t in sequence_outputs(checked)] == [("SO", [2, -1])]
    assert sequence_inputs(text_format.Parse(BASE, ModelConfig())) == []
