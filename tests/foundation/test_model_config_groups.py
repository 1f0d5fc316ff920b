"""normalize(): instance groups, reshape and optimization as Triton 2.51 fills and checks
them (texts measured against it: tests/data_plane/test_differential_http.py loads the same
configs into both)."""

from __future__ import annotations

import pytest

from foundation import model_config
from foundation.model_config import ConfigError
from foundation.proto.model_config_pb2 import ModelInstanceGroup

TENSORS = (
    'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }] '
    'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }] '
)


def _normalized(text: str, *, gpu_count: int = 0, default_cpu_instances: int = 1):
    config = model_config.parse_pbtxt(TENSORS + text)
    model_config.normalize(
        config, name="m", gpu_count=gpu_count, default_cpu_instances=default_cpu_instances
    )
    return config


def _groups(config) -> list[tuple[str, str, int, list[int]]]:
    return [
        (g.name, ModelInstanceGroup.Kind.Name(g.kind), g.count, list(g.gpus))
        for g in config.instance_group
    ]


@pytest.mark.parametrize(
    ("text", "gpu_count", "expected", "total"),
    [
        pytest.param("", 0, [("m", "KIND_CPU", 1, [])], 1, id="default-named-after-the-model"),
        pytest.param(
            'instance_group [{ count: 2 kind: KIND_CPU }, { count: 3 kind: KIND_CPU name: "g2" }]',
            0,
            [("m_0", "KIND_CPU", 2, []), ("g2", "KIND_CPU", 3, [])],
            5,
            id="two-cpu-groups",
        ),
        pytest.param(
            "instance_group [{ count: 0 kind: KIND_CPU }, { kind: KIND_AUTO }]",
            0,
            [("m_0", "KIND_CPU", 1, []), ("m_1", "KIND_CPU", 1, [])],
            2,
            id="counts-default",
        ),
        pytest.param(
            "instance_group [{ count: 2 kind: KIND_GPU }]",
            2,
            [("m_0", "KIND_GPU", 2, [0, 1])],
            4,
            id="gpu-group-takes-every-gpu",
        ),
        pytest.param(
            "instance_group [{ count: 1 kind: KIND_GPU gpus: [1] }, { count: 2 kind: KIND_CPU }]",
            2,
            [("m_0", "KIND_GPU", 1, [1]), ("m_1", "KIND_CPU", 2, [])],
            3,
            id="gpu-and-cpu",
        ),
        pytest.param(
            'instance_group [{ name: "x" count: 1 }, { name: "x" count: 2 }]',
            0,
            [("x", "KIND_CPU", 1, []), ("x", "KIND_CPU", 2, [])],
            3,
            id="same-names",
        ),
    ],
)
def test_instance_groups_are_filled_as_triton_fills_them(text, gpu_count, expected, total):
    config = _normalized(text, gpu_count=gpu_count)
    assert _groups(config) == expected
    assert model_config.instance_total(config) == total


@pytest.mark.parametrize(
    ("text", "gpu_count", "message"),
    [
        pytest.param(
            "instance_group [{ count: 1 kind: KIND_GPU }]",
            0,
            "instance group m_0 of model m has kind KIND_GPU but no GPUs are available",
            id="gpu-without-gpus",
        ),
        pytest.param(
            "instance_group [{ count: 1 kind: KIND_GPU gpus: [3] }]",
            2,
            "instance group m_0 of model m specifies invalid or unsupported gpu id 3. GPUs with "
            "at least the minimum required CUDA compute compatibility of 6.000000 are: 0 1",
            id="gpu-id",
        ),
        pytest.param(
            "instance_group [{ count: 1 kind: KIND_CPU gpus: [0] }]",
            1,
            "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs",
            id="cpu-with-gpus",
        ),
        pytest.param(
            # Triton 2.51 loads this; a negative count is refused here.
            "instance_group [{ count: -1 kind: KIND_CPU }]",
            0,
            "instance group count must be positive for m",
            id="negative-count",
        ),
    ],
)
def test_instance_groups_triton_refuses(text: str, gpu_count: int, message: str):
    with pytest.raises(ConfigError) as raised:
        _normalized(text, gpu_count=gpu_count)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("dims", "reshape"),
    [
        pytest.param("[-1, 4]", "[-1, 2, 2]", id="variable-first"),
        pytest.param("[1]", "[]", id="to-scalar"),
        pytest.param("[-1, -1]", "[-1, -1]", id="two-variable"),
        pytest.param("[-1, 6]", "[-1, 2, 3]", id="split-fixed"),
        pytest.param("[6, -1]", "[2, 3, -1]", id="variable-last"),
        pytest.param("[4]", "[2, 2]", id="fixed"),
    ],
)
def test_reshapes_triton_accepts(dims: str, reshape: str):
    config = model_config.parse_pbtxt(
        f'input [{{ name: "I" data_type: TYPE_FP32 dims: {dims} reshape {{ shape: {reshape} }} }}]'
    )
    model_config.normalize(config, name="m", gpu_count=0)


@pytest.mark.parametrize(
    ("dims", "reshape", "message"),
    [
        pytest.param("[4]", "[3]", "has different size for dims and reshape", id="size"),
        pytest.param("[-1]", "[-1, 2]", "has different size for dims and reshape", id="run-size"),
        pytest.param("[2, -1]", "[-1]", "has different size for dims and reshape", id="run-order"),
        pytest.param(
            "[4]", "[2, -1]", "has different size for dims and reshape", id="fixed-to-variable"
        ),
        pytest.param(
            "[-1, -1]",
            "[-1]",
            "has different number of variable-size dimensions for dims and reshape",
            id="variable-count",
        ),
        pytest.param(
            "[4]",
            "[2, 0, 2]",
            "reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension",
            id="zero",
        ),
    ],
)
def test_reshapes_triton_refuses(dims: str, reshape: str, message: str):
    for kind in ("input", "output"):
        config = model_config.parse_pbtxt(
            f'{kind} [{{ name: "I" data_type: TYPE_FP32 dims: {dims} '
            f"reshape {{ shape: {reshape} }} }}]"
        )
        with pytest.raises(ConfigError) as raised:
            model_config.normalize(config, name="m", gpu_count=0)
        assert str(raised.value) == f"model {kind} 'I' {message} for m"


def test_optimization_gets_tritons_pinned_memory_defaults():
    config = _normalized("")
    assert config.optimization.input_pinned_memory.enable
    assert config.optimization.output_pinned_memory.enable
    printed = model_config.to_json(config)["optimization"]
    assert printed == {
        "priority": "PRIORITY_DEFAULT",
        "input_pinned_memory": {"enable": True},
        "output_pinned_memory": {"enable": True},
        "gather_kernel_buffer_threshold": 0,
        "eager_batching": False,
    }


def test_optimization_keeps_what_the_config_says():
    config = _normalized(
        "optimization { priority: PRIORITY_MAX input_pinned_memory { enable: false } }"
    )
    printed = model_config.to_json(config)["optimization"]
    assert printed["priority"] == "PRIORITY_MAX"
    assert printed["input_pinned_memory"] == {"enable": False}
    assert printed["output_pinned_memory"] == {"enable": True}


def test_to_json_prints_fields_in_tritons_order():
    config = _normalized("max_batch_size: 4 instance_group [{ count: 1 kind: KIND_CPU }]")
    doc = model_config.to_json(config)
    # Triton 2.51's /config order: the schema's (protobuf's printer puts set fields first).
    assert list(doc) == [
        "name",
        "platform",
        "backend",
        "runtime",
        "version_policy",
        "max_batch_size",
        "input",
        "output",
        "batch_input",
        "batch_output",
        "optimization",
        "instance_group",
        "default_model_filename",
        "cc_model_filenames",
        "metric_tags",
        "parameters",
        "model_warmup",
    ]
    assert list(doc["input"][0]) == [
        "name",
        "data_type",
        "format",
        "dims",
        "is_shape_tensor",
        "allow_ragged_batch",
        "optional",
        "is_non_linear_format_io",
    ]
    assert list(doc["instance_group"][0]) == [
        "name",
        "kind",
        "count",
        "gpus",
        "secondary_devices",
        "profile",
        "passive",
        "host_policy",
    ]
