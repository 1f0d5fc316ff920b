from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format

from foundation import model_config
from foundation.model_config import ConfigError
from foundation.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup, ModelQueuePolicy
from runtimes.registry import runtime_class_for

FULL_PBTXT = """
# a Triton config as users write it
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_STRING dims: [ -1 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] label_filename: "labels.txt" } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { specific: { versions: [ 1, 3 ] } }
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 500 }
  priority_queue_policy { key: 2 value: { max_queue_size: 3 allow_timeout_override: true } }
}
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
"""


def test_parse_pbtxt_reads_every_field_users_set():
    config = model_config.parse_pbtxt(FULL_PBTXT)
    assert config.name == "simple"
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert list(config.input[1].dims) == [-1]
    assert config.instance_group[0].count == 2
    assert list(config.version_policy.specific.versions) == [1, 3]
    batching = config.dynamic_batching
    assert list(batching.preferred_batch_size) == [4, 8]
    assert batching.default_queue_policy.timeout_action == ModelQueuePolicy.DELAY
    assert batching.priority_queue_policy[2].max_queue_size == 3
    assert config.parameters["intra_op_thread_count"].string_value == "2"


def test_parse_pbtxt_rejects_unknown_fields():
    with pytest.raises(ConfigError, match='has no field named "foo"'):
        model_config.parse_pbtxt('name: "x" foo: 1')


def test_parse_json_accepts_lower_case_enums_and_string_int64():
    config = model_config.parse_json(
        '{"input":[{"name":"a","data_type":"type_fp32","dims":["3", 4]}],'
        '"dynamic_batching":{"default_queue_policy":{"timeout_action":"delay"}}}'
    )
    assert list(config.input[0].dims) == [3, 4]
    assert config.dynamic_batching.default_queue_policy.timeout_action == ModelQueuePolicy.DELAY


def test_parse_json_rejects_unknown_fields():
    with pytest.raises(ConfigError):
        model_config.parse_json('{"bogus": 1}')


def test_normalize_fills_triton_defaults():
    config = model_config.parse_pbtxt(
        'max_batch_size: 4 dynamic_batching {} input [{name: "a" data_type: TYPE_FP32 dims: [2]}]'
    )
    model_config.normalize(config, name="m", gpu_count=0)
    assert config.name == "m"
    assert config.version_policy.latest.num_versions == 1
    assert list(config.dynamic_batching.preferred_batch_size) == [4]
    group = config.instance_group[0]
    assert (group.name, group.count, group.kind) == ("m", 1, ModelInstanceGroup.KIND_CPU)


@pytest.mark.parametrize(
    ("text", "gpu_count", "count"),
    [
        pytest.param('backend: "onnxruntime"', 0, 2, id="onnx-cpu"),
        pytest.param('platform: "onnxruntime_onnx"', 0, 2, id="onnx-platform-cpu"),
        pytest.param('backend: "onnxruntime" instance_group [{ count: 1 }]', 0, 1, id="onnx-set"),
        pytest.param('backend: "onnxruntime"', 1, 1, id="onnx-gpu"),
        pytest.param('backend: "pytorch"', 0, 1, id="pytorch-cpu"),
        pytest.param('backend: "python"', 0, 1, id="python-cpu"),
    ],
)
def test_default_instance_count_is_tritons(text, gpu_count, count):
    # Triton gives ONNX Runtime (and TensorFlow) models on CPU two instances when the
    # configuration leaves the count out, every other model one.
    # The repository's order: the runtime from the configuration, then normalize with its
    # default.
    config = model_config.parse_pbtxt(text)
    runtime = runtime_class_for(config, None)
    model_config.normalize(
        config, name="m", gpu_count=gpu_count, default_cpu_instances=runtime.default_cpu_instances
    )
    assert config.instance_group[0].count == count


def test_normalize_picks_gpu_for_auto_kind_when_there_is_one():
    config = ModelConfig()
    model_config.normalize(config, name="m", gpu_count=1)
    assert config.instance_group[0].kind == ModelInstanceGroup.KIND_GPU
    assert list(config.instance_group[0].gpus) == [0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param('name: "other"', "expecting 'm', got 'other'", id="name-mismatch"),
        pytest.param("max_batch_size: -1", "must be non-negative", id="negative-batch"),
        pytest.param(
            "max_batch_size: 4 dynamic_batching { preferred_batch_size: [8] }",
            "must be <= max batch size",
            id="preferred-too-big",
        ),
        pytest.param(
            "max_batch_size: 4 dynamic_batching { preferred_batch_size: [0] }",
            "preferred size must be positive",
            id="preferred-zero",
        ),
        pytest.param(
            "max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
            "default priority level must be in range [1, 2]",
            id="bad-default-priority",
        ),
        pytest.param(
            "instance_group [{ kind: KIND_GPU }]", "no GPUs are available", id="gpu-without-gpu"
        ),
        pytest.param(
            'input [{ name: "a" data_type: TYPE_FP32 dims: [0] }]',
            "dimension must be integer >= 1",
            id="zero-dim",
        ),
        pytest.param(
            'input [{ name: "a" dims: [1] }]', "must specify 'data_type'", id="no-datatype"
        ),
        pytest.param(
            'input [{ name: "a" data_type: TYPE_FP32 dims: [1] },'
            ' { name: "a" data_type: TYPE_FP32 dims: [1] }]',
            "duplicate input 'a'",
            id="duplicate-input",
        ),
        pytest.param(
            "sequence_batching { iterative_sequence: true }",
            "iterative sequences",
            id="iterative-sequence-batching",
        ),
    ],
)
def test_normalize_rejects_what_triton_rejects(text: str, message: str):
    config = model_config.parse_pbtxt(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        model_config.normalize(config, name="m", gpu_count=0)


def test_to_json_prints_int64_fields_as_numbers_and_enums_as_names():
    config = model_config.parse_pbtxt(FULL_PBTXT)
    model_config.normalize(config, name="simple", gpu_count=0)
    doc = model_config.to_json(config)
    assert doc["input"][0]["dims"] == [16]
    assert doc["input"][0]["data_type"] == "TYPE_INT32"
    assert doc["version_policy"]["specific"]["versions"] == [1, 3]
    batching = doc["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 100
    assert batching["priority_levels"] == 2
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 500
    assert batching["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 0
    assert doc["max_batch_size"] == 8
    # Defaults are printed, as Triton prints them.
    assert doc["input"][0]["allow_ragged_batch"] is False


def _versions(tmp_path: Path, *names: str) -> Path:
    for name in names:
        (tmp_path / name).mkdir()
    return tmp_path


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        pytest.param("", [3], id="default-latest-1"),
        pytest.param("version_policy { latest { num_versions: 2 } }", [2, 3], id="latest-2"),
        pytest.param("version_policy { all {} }", [1, 2, 3], id="all"),
        pytest.param("version_policy { specific { versions: [1, 9] } }", [1], id="specific"),
    ],
)
def test_versions_to_load_follows_the_policy(tmp_path: Path, policy: str, expected: list[int]):
    model_dir = _versions(tmp_path, "1", "2", "3", "007", "notes")
    config = model_config.parse_pbtxt(policy)
    model_config.normalize(config, name="m", gpu_count=0)
    assert model_config.versions_to_load(model_dir, config) == expected


def test_versions_to_load_without_versions_is_an_error(tmp_path: Path):
    config = ModelConfig()
    model_config.normalize(config, name="m", gpu_count=0)
    with pytest.raises(ConfigError, match="at least one version must be available"):
        model_config.versions_to_load(tmp_path, config)


@pytest.mark.parametrize("name", ["", "..", ".", "a/b", "a\\b", "x" * 300])
def test_validate_model_name_refuses_escaping_names(name: str):
    with pytest.raises(ConfigError):
        model_config.validate_model_name(name)


@pytest.mark.parametrize(
    "filename",
    [
        pytest.param("/etc/evil.py", id="absolute"),
        pytest.param("../../outside/evil.py", id="dot-dot"),
        pytest.param("..", id="parent"),
        pytest.param(".", id="self"),
        pytest.param("sub/model.onnx", id="separator"),
        pytest.param("..\\evil.py", id="backslash"),
        pytest.param("model\x00.py", id="nul"),
        pytest.param("model\n.py", id="newline"),
    ],
)
def test_default_model_filename_must_be_a_plain_file_name(filename: str):
    document = json.dumps({"backend": "python", "default_model_filename": filename})
    with pytest.raises(ConfigError, match="'default_model_filename' must be the name of a file"):
        model_config.parse_json(document)
    config = ModelConfig(default_model_filename=filename)
    with pytest.raises(ConfigError, match="'default_model_filename' must be the name of a file"):
        model_config.parse_pbtxt(text_format.MessageToString(config))


def test_a_plain_default_model_filename_is_accepted():
    config = model_config.parse_pbtxt('default_model_filename: "net-v2.onnx"')
    assert config.default_model_filename == "net-v2.onnx"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            'model_operations { op_library_filename: "/opt/ops/libcustom.so" }',
            "'model_operations.op_library_filename' is not supported",
            id="op-library",
        ),
    ],
)
def test_unsupported_fields_are_refused_not_ignored(text: str, message: str):
    with pytest.raises(ConfigError, match=message):
        model_config.parse_pbtxt(text)
    as_json = json.dumps(model_config.to_json(text_format.Parse(text, ModelConfig())))
    with pytest.raises(ConfigError, match=message):
        model_config.parse_json(as_json)


def test_versions_to_load_ignores_folders_named_with_other_digits(tmp_path: Path):
    model_dir = _versions(tmp_path, "1", "１", "³", "١٢")
    config = model_config.parse_pbtxt("version_policy { all {} }")
    model_config.normalize(config, name="m", gpu_count=0)
    assert model_config.versions_to_load(model_dir, config) == [1]
