"""The sequence batcher's part of a model config: Triton's checks and defaults for
``sequence_batching``, and the tensors the batcher adds to a model's requests.

:func:`normalize_sequence_batching` is what :func:`foundation.model_config.normalize` runs for
a sequence model: Triton's load-time checks of the control inputs (with its texts, from
``ValidateModelConfig``), its defaults (``max_sequence_idle_microseconds`` of one second,
the oldest strategy's preferred batch size), and refusals where Triton loads a config it then
serves wrongly or crashes on (a state without an input name, a control or state tensor that
is also a request input, iterative sequences, which need request rescheduling that the
runtimes lack).

:func:`sequence_inputs` and :func:`sequence_outputs` describe the tensors the batcher feeds
(control and state inputs) and reads back (state outputs), so that a runtime checking its
config against the model counts them as the model's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, cast

from foundation.datatypes import config_from_protocol, protocol_from_config
from foundation.proto.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelSequenceBatching as Batching,
)

SEQUENCE_IDLE_DEFAULT_US: Final = 1_000_000
"""Triton's ``max_sequence_idle_microseconds`` when a config leaves it 0."""

START: Final = "CONTROL_SEQUENCE_START"
END: Final = "CONTROL_SEQUENCE_END"
READY: Final = "CONTROL_SEQUENCE_READY"
CORRID: Final = "CONTROL_SEQUENCE_CORRID"

_CORRID_TYPES: Final = frozenset(
    (
        DataType.TYPE_UINT64,
        DataType.TYPE_INT64,
        DataType.TYPE_UINT32,
        DataType.TYPE_INT32,
        DataType.TYPE_STRING,
    )
)


class SequenceConfigError(ValueError):
    """A ``sequence_batching`` section Triton refuses at load, with Triton's text."""


@dataclass(frozen=True, slots=True)
class Control:
    """One control tensor: which signal it carries, its name, datatype and values."""

    kind: str
    """``CONTROL_SEQUENCE_START``, ``_END``, ``_READY`` or ``_CORRID``."""
    name: str
    datatype: str
    """Protocol datatype: INT32, FP32 or BOOL for the boolean kinds; CORRID's own."""
    false_value: float | int | bool = 0
    true_value: float | int | bool = 1


def controls(batching: Batching) -> tuple[Control, ...]:
    """The control tensors of a checked ``sequence_batching``, in config order."""
    found: list[Control] = []
    for control_input in batching.control_input:
        for control in control_input.control:
            kind = Batching.Control.Kind.Name(control.kind)
            if kind == CORRID:
                datatype = protocol_from_config(control.data_type)
                found.append(Control(kind, control_input.name, datatype))
            elif control.int32_false_true:
                false, true = control.int32_false_true
                found.append(Control(kind, control_input.name, "INT32", false, true))
            elif control.fp32_false_true:
                false_f, true_f = control.fp32_false_true
                found.append(Control(kind, control_input.name, "FP32", false_f, true_f))
            else:
                false_b, true_b = control.bool_false_true
                found.append(Control(kind, control_input.name, "BOOL", false_b, true_b))
    return tuple(found)


def normalize_sequence_batching(config: ModelConfig) -> None:
    """Check ``config.sequence_batching`` as Triton does at load and fill its defaults.

    Raises SequenceConfigError with Triton's text (``sequence batching control tensor must
    have a name for <model>``...) or, where Triton has none, a text saying what is wrong.
    """
    name = config.name
    batching = config.sequence_batching
    if batching.iterative_sequence:
        raise SequenceConfigError(
            f"model '{name}': iterative sequences ('iterative_sequence: true') are not "
            "supported by zeroserve"
        )
    # Triton checks the kinds in this order, each pass over every control input.
    for kind in (START, END, READY, CORRID):
        _check_control(batching, name, kind)
    corrid_types = [
        control.data_type
        for control_input in batching.control_input
        for control in control_input.control
        if Batching.Control.Kind.Name(control.kind) == CORRID
    ]
    if any(datatype not in _CORRID_TYPES for datatype in corrid_types):
        raise SequenceConfigError(
            f"unexpected data type for control {CORRID} for {name}. Allowed data types "
            "are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
        )
    if batching.HasField("oldest"):
        for size in batching.oldest.preferred_batch_size:
            if size <= 0:
                raise SequenceConfigError(
                    f"sequence batching preferred batch size must be positive for {name}"
                )
            if size > config.max_batch_size:
                raise SequenceConfigError(
                    f"sequence batching preferred batch size must be <= max batch size for {name}"
                )
    if batching.HasField("direct"):
        utilization = batching.direct.minimum_slot_utilization
        if not 0.0 <= utilization <= 1.0:
            raise SequenceConfigError(
                f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}"
            )
    _check_names(config)
    if batching.max_sequence_idle_microseconds == 0:
        batching.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
    if (
        batching.HasField("oldest")
        and not batching.oldest.preferred_batch_size
        and config.max_batch_size > 0
    ):
        batching.oldest.preferred_batch_size.append(config.max_batch_size)


def _check_control(batching: Batching, model: str, kind: str) -> None:
    """Triton's ``Get{Boolean,Typed}SequenceControlProperties`` checks for one kind."""
    seen_tensors: set[str] = set()
    seen_kind = False
    for control_input in batching.control_input:
        if not control_input.name:
            raise SequenceConfigError(
                f"sequence batching control tensor must have a name for {model}"
            )
        if control_input.name in seen_tensors:
            raise SequenceConfigError(
                f"sequence batching control tensor '{control_input.name}' is specified for "
                f"multiple control kinds for {model}"
            )
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            if Batching.Control.Kind.Name(control.kind) != kind:
                continue
            if seen_kind:
                raise SequenceConfigError(
                    f"sequence batching specifies multiple {kind} tensors for {model}"
                )
            seen_kind = True
            forms = [
                form
                for form, values in (
                    ("int32_false_true", control.int32_false_true),
                    ("fp32_false_true", control.fp32_false_true),
                    ("bool_false_true", control.bool_false_true),
                )
                if values
            ]
            if kind == CORRID:
                if forms:
                    raise SequenceConfigError(
                        "sequence batching must not specify either 'int32_false_true', "
                        f"'fp32_false_true' or 'bool_false_true' for {kind} for {model}"
                    )
                continue
            if not forms:
                raise SequenceConfigError(
                    "sequence batching must specify either 'int32_false_true', "
                    f"'fp32_false_true' or 'bool_false_true' for {kind} for {model}"
                )
            if len(forms) > 1:
                raise SequenceConfigError(
                    "sequence batching specifies more than one from 'int32_false_true', "
                    f"'fp32_false_true' and 'bool_false_true' for {kind} for {model}"
                )
            if len(getattr(control, forms[0])) != 2:
                raise SequenceConfigError(
                    f"sequence batching control '{forms[0]}' must have exactly 2 entries for "
                    f"{kind} for {model}"
                )


def _check_names(config: ModelConfig) -> None:
    """Refusals where Triton loads and then misbehaves: a state without names, or a
    control or state input that is also a request input (Triton overwrites the client's
    data with its own)."""
    model = config.name
    request_inputs = {t.name for t in config.input}
    batching = config.sequence_batching
    for control_input in batching.control_input:
        if control_input.name in request_inputs:
            raise SequenceConfigError(
                f"sequence batching control tensor '{control_input.name}' of model '{model}' "
                "is also a configured input; the batcher provides it, so leave it out of "
                "'input'"
            )
    controls_names = {c.name for c in batching.control_input}
    for state in batching.state:
        if not state.input_name or not state.output_name:
            raise SequenceConfigError(
                f"sequence batching state of model '{model}' must have an 'input_name' and "
                "an 'output_name'"
            )
        if state.input_name in request_inputs or state.input_name in controls_names:
            raise SequenceConfigError(
                f"sequence batching state input '{state.input_name}' of model '{model}' is "
                "also a configured or control input; the batcher provides it"
            )
        if state.data_type == DataType.TYPE_INVALID:
            raise SequenceConfigError(
                f"sequence batching state '{state.input_name}' of model '{model}' must have a "
                "'data_type'"
            )
        for initial in state.initial_state:
            if initial.data_file:
                _check_plain_name(initial.data_file, model)


def _check_plain_name(value: str, model: str) -> None:
    # The file is read from the model's initial_state folder: no path may lead elsewhere.
    if value in (".", "..") or "/" in value or "\\" in value or "\x00" in value:
        raise SequenceConfigError(
            f"'initial_state' data_file of model '{model}' must be the name of a file in its "
            f"initial_state folder, not a path: {value!r}"
        )


def sequence_inputs(config: ModelConfig) -> list[ModelInput]:
    """The inputs the batcher adds to each request of a sequence model: its control
    tensors (dims [1]) and its state inputs (the state's dims and datatype)."""
    if not config.HasField("sequence_batching"):
        return []
    added: list[ModelInput] = []
    for control in controls(config.sequence_batching):
        datatype = cast(DataType, config_from_protocol(control.datatype))
        added.append(ModelInput(name=control.name, data_type=datatype, dims=[1]))
    for state in _unique_states(config.sequence_batching.state):
        added.append(ModelInput(name=state.input_name, data_type=state.data_type, dims=state.dims))
    return added


def sequence_tensor_names(config: ModelConfig) -> tuple[frozenset[str], frozenset[str]]:
    """The names of the inputs the batcher feeds and of the outputs it keeps, read from a
    config that may not have been checked yet (auto-complete runs before the checks)."""
    batching = config.sequence_batching
    inputs = {c.name for c in batching.control_input} | {s.input_name for s in batching.state}
    outputs = {s.output_name for s in batching.state}
    return frozenset(inputs - {""}), frozenset(outputs - {""})


def sequence_outputs(config: ModelConfig) -> list[ModelOutput]:
    """The state outputs a sequence model produces for the batcher to keep."""
    if not config.HasField("sequence_batching"):
        return []
    return [
        ModelOutput(name=s.output_name, data_type=s.data_type, dims=s.dims)
        for s in _unique_states(config.sequence_batching.state)
    ]


def _unique_states(states: Sequence[Batching.State]) -> list[Batching.State]:
    """The states Triton keeps: a later state repeating an input or output name is
    ignored (Triton logs a warning and drops it)."""
    kept: list[Batching.State] = []
    inputs: set[str] = set()
    outputs: set[str] = set()
    for state in states:
        if state.input_name in inputs or state.output_name in outputs:
            continue
        inputs.add(state.input_name)
        outputs.add(state.output_name)
        kept.append(state)
    return kept


def unique_states(config: ModelConfig) -> list[Batching.State]:
    """The states of ``config`` Triton keeps (see :func:`sequence_outputs`)."""
    return _unique_states(config.sequence_batching.state)
