"""Model configuration: Triton's ModelConfig parsed, validated, normalized and printed.

config.pbtxt is read with protobuf's text format against our copy of Triton's schema, so
Triton users' repositories load as they are. JSON configs (the load API's ``config``
parameter, the admin API) use the same field names. ``normalize`` applies the defaults
Triton applies before a model serves, and ``to_json`` prints what ``/config`` returns.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final, cast

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from foundation import ensemble_config
from foundation.proto.model_config_pb2 import (
    ModelConfig,
    ModelInstanceGroup,
    ModelQueuePolicy,
)
from foundation.sequence_config import SequenceConfigError, normalize_sequence_batching

_INT64_PATHS: Final[tuple[tuple[str, ...], ...]] = (
    ("input", "*", "dims"),
    ("input", "*", "reshape", "shape"),
    ("output", "*", "dims"),
    ("output", "*", "reshape", "shape"),
    ("version_policy", "specific", "versions"),
    ("dynamic_batching", "max_queue_delay_microseconds"),
    ("dynamic_batching", "priority_levels"),
    ("dynamic_batching", "default_priority_level"),
    ("dynamic_batching", "default_queue_policy", "default_timeout_microseconds"),
    ("dynamic_batching", "priority_queue_policy", "**", "default_timeout_microseconds"),
    ("sequence_batching", "max_sequence_idle_microseconds"),
    ("sequence_batching", "oldest", "max_queue_delay_microseconds"),
    ("sequence_batching", "direct", "max_queue_delay_microseconds"),
    ("sequence_batching", "state", "*", "dims"),
    ("ensemble_scheduling", "step", "*", "model_version"),
    ("model_warmup", "*", "inputs", "**", "dims"),
)
"""Fields protobuf prints as JSON strings (int64/uint64) that Triton prints as numbers."""

_ENUM_VALUE = re.compile(r'("(?:data_type|kind|timeout_action|format|priority)"\s*:\s*")([^"]*)"')

MODEL_NAME_MAX_LENGTH: Final = 255

_VERSION: Final = re.compile(r"[0-9]+")
"""A version as it appears in a folder name or a URL: ASCII digits only."""


class ConfigError(ValueError):
    """A model configuration that cannot be parsed or breaks Triton's rules."""


def parse_pbtxt(text: str) -> ModelConfig:
    """Parse config.pbtxt text; unknown fields are errors, as in Triton.

    Also refuses what :func:`check_fields` refuses.
    """
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"failed to parse config.pbtxt: {exc}") from exc
    check_fields(config)
    return config


def parse_json(text: str | bytes) -> ModelConfig:
    """Parse a JSON ModelConfig; enum names are matched case-insensitively, as Triton does.

    Also refuses what :func:`check_fields` refuses.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    # protobuf's Python JSON parser has no case-insensitive enum option, Triton's C++ one does.
    text = _ENUM_VALUE.sub(lambda m: m.group(1) + m.group(2).upper() + '"', text)
    config = ModelConfig()
    try:
        json_format.Parse(text, config, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise ConfigError(str(exc)) from exc
    check_fields(config)
    return config


def check_fields(config: ModelConfig) -> None:
    """Refuse fields that would reach outside the model's folder, or that zeroserve ignores.

    Checked when a config is parsed, before any field is used to find a file: a config can
    come from anyone who may write to the model store or call the load or admin API.
    """
    if config.default_model_filename:
        check_file_name(config.default_model_filename, field="default_model_filename")
    if config.model_operations.op_library_filename:
        raise ConfigError(
            "'model_operations.op_library_filename' is not supported by zeroserve: custom "
            "operation libraries are not loaded"
        )
    # EXECUTION_ENV_PATH is checked where the model's folder is known: the Python runtime
    # refuses an environment outside it.


def check_file_name(value: str, *, field: str) -> None:
    """Refuse a file name that is not a plain name of a file inside the version folder.

    The name is joined onto the version folder, so an absolute path, a separator or
    ``..`` would lead anywhere on the host.
    """
    if (
        not value
        or value in (".", "..")
        or "/" in value
        or "\\" in value
        or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
    ):
        raise ConfigError(
            f"'{field}' must be the name of a file in the version folder, not a path: {value!r}"
        )


def is_version(text: str) -> bool:
    """Whether ``text`` spells a version number: ASCII digits only.

    ``str.isdigit`` also accepts other scripts' digits (``'١'``, ``'１'``) and superscripts
    (``'³'``, which ``int`` refuses), so ``'１'`` would name version 1.
    """
    return _VERSION.fullmatch(text) is not None


def read_config_file(model_dir: Path) -> ModelConfig | None:
    """The model folder's config.pbtxt, or None when it has none."""
    path = model_dir / "config.pbtxt"
    if not path.is_file():
        return None
    return parse_pbtxt(path.read_text(encoding="utf-8"))


def validate_model_name(name: str) -> None:
    """Refuse names that are empty, too long, or could escape a folder."""
    if not name:
        raise ConfigError("Model name cannot be empty. Please enter a valid name to deploy.")
    if (
        name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or len(name) > MODEL_NAME_MAX_LENGTH
    ):
        raise ConfigError(
            f"invalid model name '{name}', model name must not contain path traversal characters"
        )


def normalize(
    config: ModelConfig, *, name: str, gpu_count: int, default_cpu_instances: int = 1
) -> None:
    """Validate ``config`` and fill Triton's defaults in place.

    After this, ``name`` is set, ``version_policy`` is explicit, every instance group has a
    name, a concrete kind, a count and (KIND_GPU) its GPUs, dynamic batching has its
    preferred sizes and ``optimization`` its pinned-memory defaults. ``gpu_count`` decides
    what KIND_AUTO means and which GPUs a KIND_GPU group without ``gpus`` takes (all of them,
    as in Triton); ``default_cpu_instances`` is the count of a KIND_CPU group that leaves it
    out (the runtime's; one per GPU otherwise).
    """
    if config.name and config.name != name:
        raise ConfigError(
            f"unexpected 'name' in model configuration, expecting '{name}', got '{config.name}'"
        )
    config.name = name
    if config.max_batch_size < 0:
        raise ConfigError(f"'max_batch_size' must be non-negative value for {name}")
    _check_response_cache(config)
    if config.HasField("sequence_batching"):
        try:
            normalize_sequence_batching(config)
        except SequenceConfigError as exc:
            raise ConfigError(str(exc)) from exc
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    elif config.version_policy.HasField("latest") and config.version_policy.latest.num_versions < 1:
        config.version_policy.latest.num_versions = 1
    # An ensemble runs no instances and holds no buffers of its own: Triton adds neither
    # instance groups nor pinned-memory settings to its config, and refuses them.
    is_ensemble = config.HasField("ensemble_scheduling")
    if not is_ensemble:
        _normalize_instance_groups(
            config, gpu_count=gpu_count, default_cpu_instances=default_cpu_instances
        )
    if config.HasField("dynamic_batching"):
        _normalize_dynamic_batching(config)
    if not is_ensemble:
        # Triton pins host buffers unless told not to, and says so in the config it prints.
        optimization = config.optimization
        for field in ("input_pinned_memory", "output_pinned_memory"):
            if not optimization.HasField(field):
                getattr(optimization, field).enable = True
    _check_tensors(config)
    try:
        ensemble_config.check_scheduling(config)
    except ensemble_config.EnsembleConfigError as exc:
        raise ConfigError(str(exc)) from exc


def _check_response_cache(config: ModelConfig) -> None:
    """Triton's refusals, in its words and order, of a response cache for models whose
    answers do not follow from one request alone."""
    if not config.response_cache.enable:
        return
    if config.HasField("sequence_batching"):
        raise ConfigError(
            f"Response Cache does not currently support model {config.name} with sequence "
            "batching scheduler. Please disable the response cache."
        )
    if config.model_transaction_policy.decoupled:
        raise ConfigError(
            f"Response Cache does not currently support model {config.name} with 'decoupled' "
            "transaction policy. Please disable the response cache."
        )


def _normalize_instance_groups(
    config: ModelConfig, *, gpu_count: int, default_cpu_instances: int
) -> None:
    if not config.instance_group:
        # Triton names the group it adds after the model, and groups it was given
        # <model>_<index>.
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        _normalize_instance_group(
            config.name, group, gpu_count=gpu_count, default_cpu_instances=default_cpu_instances
        )


def _normalize_instance_group(
    model: str, group: ModelInstanceGroup, *, gpu_count: int, default_cpu_instances: int
) -> None:
    if group.kind in (ModelInstanceGroup.KIND_AUTO, ModelInstanceGroup.KIND_MODEL):
        has_gpus = bool(group.gpus) or gpu_count > 0
        group.kind = ModelInstanceGroup.KIND_GPU if has_gpus else ModelInstanceGroup.KIND_CPU
    if group.kind == ModelInstanceGroup.KIND_CPU and group.gpus:
        raise ConfigError(
            f"instance group {group.name} of model {model} has kind KIND_CPU but specifies one "
            "or more GPUs"
        )
    if group.kind == ModelInstanceGroup.KIND_GPU:
        if gpu_count == 0:
            raise ConfigError(
                f"instance group {group.name} of model {model} has kind KIND_GPU but no GPUs "
                "are available"
            )
        if not group.gpus:
            group.gpus.extend(range(gpu_count))
        for gpu in group.gpus:
            if gpu < 0 or gpu >= gpu_count:
                available = " ".join(str(g) for g in range(gpu_count))
                raise ConfigError(
                    f"instance group {group.name} of model {model} specifies invalid or "
                    f"unsupported gpu id {gpu}. GPUs with at least the minimum required CUDA "
                    f"compute compatibility of 6.000000 are: {available}"
                )
    if group.count < 0:
        raise ConfigError(f"instance group count must be positive for {model}")
    if group.count == 0:
        is_cpu = group.kind == ModelInstanceGroup.KIND_CPU
        group.count = default_cpu_instances if is_cpu else 1


def instance_total(config: ModelConfig) -> int:
    """How many instances a normalized config asks for, as Triton counts them: each group's
    count, once per GPU of a KIND_GPU group."""
    total = 0
    for group in config.instance_group:
        per_device = max(group.count, 1)
        is_gpu = group.kind == ModelInstanceGroup.KIND_GPU
        total += per_device * max(len(group.gpus), 1) if is_gpu else per_device
    return max(total, 1)


def _normalize_dynamic_batching(config: ModelConfig) -> None:
    batching = config.dynamic_batching
    name = config.name
    for size in batching.preferred_batch_size:
        if size <= 0:
            raise ConfigError(f"dynamic batching preferred size must be positive for {name}")
        if size > config.max_batch_size:
            raise ConfigError(
                f"dynamic batching preferred size must be <= max batch size for {name}"
            )
    if not batching.preferred_batch_size and config.max_batch_size > 0:
        batching.preferred_batch_size.append(config.max_batch_size)
    levels = batching.priority_levels
    if levels:
        if not 1 <= batching.default_priority_level <= levels:
            raise ConfigError(f"default priority level must be in range [1, {levels}] for {name}")
        for level in batching.priority_queue_policy:
            if not 1 <= level <= levels:
                raise ConfigError(
                    f"priority queue policy must have priority level in range [1, {levels}] "
                    f"for {name}"
                )
    if batching.preserve_ordering:
        if levels > 1:
            raise ConfigError(
                f"Only one priority level is allowed when 'preserve_ordering' is true for {name}"
            )
        policy = batching.default_queue_policy
        if policy.timeout_action == ModelQueuePolicy.DELAY and policy.default_timeout_microseconds:
            raise ConfigError(
                "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is "
                f"true for {name}"
            )


def _check_tensors(config: ModelConfig) -> None:
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for tensor in tensors:
            if not tensor.name:
                raise ConfigError(f"model '{config.name}' must specify 'name' for all {kind}s")
            if tensor.name in seen:
                raise ConfigError(f"model '{config.name}' has duplicate {kind} '{tensor.name}'")
            seen.add(tensor.name)
            if tensor.data_type == 0:
                raise ConfigError(
                    f"model {kind} '{tensor.name}' must specify 'data_type' for {config.name}"
                )
            for dim in tensor.dims:
                if dim == 0 or dim < -1:
                    raise ConfigError(
                        f"model {kind} '{tensor.name}' dimension must be integer >= 1, or -1 "
                        f"to indicate a variable-size dimension for {config.name}"
                    )
            if tensor.HasField("reshape"):
                _check_reshape(kind, tensor.name, tensor.dims, tensor.reshape.shape, config.name)


def _check_reshape(
    kind: str, name: str, dims: Sequence[int], shape: Sequence[int], model: str
) -> None:
    """Triton's rules: the reshape holds as many elements as the dims, and its variable-size
    dimensions split it into runs of the same sizes as the dims' do, so that each -1 of one
    takes the size of the same -1 of the other."""
    if any(dim == 0 or dim < -1 for dim in shape):
        raise ConfigError(
            f"model {kind} '{name}' reshape dimensions must be integer >= 1, or -1 to indicate "
            f"a variable-size dimension for {model}"
        )
    different_size = ConfigError(
        f"model {kind} '{name}' has different size for dims and reshape for {model}"
    )
    if _element_count(dims) != _element_count(shape):
        raise different_size
    dim_runs, shape_runs = _fixed_runs(dims), _fixed_runs(shape)
    if len(dim_runs) != len(shape_runs):
        raise ConfigError(
            f"model {kind} '{name}' has different number of variable-size dimensions for dims "
            f"and reshape for {model}"
        )
    if dim_runs != shape_runs:
        raise different_size


def _element_count(dims: Sequence[int]) -> int:
    """Elements in ``dims``; -1 when one of them is variable."""
    return -1 if -1 in dims else math.prod(dims)


def _fixed_runs(dims: Sequence[int]) -> list[int]:
    """The element counts of the runs of fixed dimensions around each -1."""
    runs, count = [], 1
    for dim in dims:
        if dim == -1:
            runs.append(count)
            count = 1
        else:
            count *= dim
    runs.append(count)
    return runs


def to_json(config: ModelConfig) -> dict[str, Any]:
    """The config as Triton's ``/config`` prints it: proto names, defaults, int64 as numbers."""
    doc: dict[str, Any] = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    for path in _INT64_PATHS:
        _ints_at(doc, path)
    scheduling = doc.get("ensemble_scheduling")
    if scheduling is not None and not scheduling.get("max_inflight_requests"):
        # Newer than Triton 2.51's schema, whose configs print no such key: shown when set.
        scheduling.pop("max_inflight_requests", None)
    # Triton prints fields in the schema's order; protobuf's printer puts set fields first.
    return _in_field_order(doc, cast(Descriptor, ModelConfig.DESCRIPTOR))


def _in_field_order(doc: dict[str, Any], descriptor: Descriptor) -> dict[str, Any]:
    ordered: dict[str, Any] = {}
    for field in descriptor.fields:
        if field.name in doc:
            ordered[field.name] = _field_in_order(doc[field.name], field)
    for key, value in doc.items():
        ordered.setdefault(key, value)
    return ordered


def _field_in_order(value: Any, field: FieldDescriptor) -> Any:
    message = field.message_type
    if message is None:
        return value
    if message.GetOptions().map_entry:
        entry = message.fields_by_name["value"]
        return {key: _field_in_order(item, entry) for key, item in value.items()}
    if field.is_repeated:
        return [_in_field_order(item, message) for item in value]
    return _in_field_order(value, message)


def _ints_at(node: Any, path: tuple[str, ...]) -> None:
    if not path or node is None:
        return
    head, rest = path[0], path[1:]
    if head == "*":
        for item in node if isinstance(node, list) else ():
            _ints_at(item, rest)
        return
    if head == "**":
        for item in node.values() if isinstance(node, dict) else ():
            _ints_at(item, rest)
        return
    if not isinstance(node, dict) or head not in node:
        return
    if rest:
        _ints_at(node[head], rest)
    elif isinstance(node[head], list):
        node[head] = [int(v) for v in node[head]]
    else:
        node[head] = int(node[head])


def versions_to_load(model_dir: Path, config: ModelConfig) -> list[int]:
    """The version folders the config's version policy selects, ascending.

    Version folders have integer names; names with a leading zero (other than ``0``) are
    ignored, as Triton ignores them.
    """
    available = [
        int(entry.name)
        for entry in model_dir.iterdir()
        if entry.is_dir()
        and is_version(entry.name)
        and (entry.name == "0" or not entry.name.startswith("0"))
    ]
    return select_versions(available, config, config.name)


def select_versions(available: Iterable[int], config: ModelConfig, name: str) -> list[int]:
    """The version numbers among ``available`` that the config's version policy selects,
    ascending; ConfigError (naming model ``name``) when it selects none."""
    ordered = sorted(available)
    policy = config.version_policy
    if policy.HasField("all"):
        chosen = ordered
    elif policy.HasField("specific"):
        wanted = set(policy.specific.versions)
        chosen = [v for v in ordered if v in wanted]
    else:
        chosen = ordered[-max(policy.latest.num_versions, 1) :] if ordered else []
    if not chosen:
        raise ConfigError(
            f"at least one version must be available under the version policy of model '{name}'"
        )
    return chosen
