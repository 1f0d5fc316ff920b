"""Model control over gRPC, the same steps against real Triton 2.51 and zeroserve in
explicit mode: index, loads that work and loads that fail, a config override, unloads and
what the other RPCs say of an unloaded model. The steps run in order, on one server each.

Where zeroserve's repository answers otherwise than Triton, for HTTP and gRPC alike, the
step is an expected failure naming the difference."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

from data_plane.settings import ModelControlMode
from foundation.proto import grpc_service_pb2 as pb
from tests.data_plane.grpc.differential import Case, channel_to, check, write_twin_repositories
from tests.data_plane.grpc.serving import serving
from tests.models import read_config, write_python_model
from tests.triton_oracle import triton_for, write_python_backend_model

pytestmark = pytest.mark.integration

OVERRIDE = {
    "name": "add_sub",
    "max_batch_size": 4,
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
        {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]},
    ],
    "output": [
        {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]},
        {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [16]},
    ],
}


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    zeroserve_repo = tmp_path_factory.mktemp("zeroserve-repo")
    triton_repo = tmp_path_factory.mktemp("triton-repo")
    write_twin_repositories(zeroserve_repo, triton_repo)
    # A Python model that fails as it is imported, in each server's model.py form.
    broken = write_python_model(zeroserve_repo, "broken", source="this is not python(\n")
    write_python_backend_model(triton_repo, read_config(broken), "this is not python(\n")
    return zeroserve_repo, triton_repo


@pytest.fixture(scope="module")
def triton(
    repos: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[grpc.Channel]:
    log_dir = tmp_path_factory.mktemp("triton-log")
    with triton_for(repos[1], log_dir, "--model-control-mode=explicit") as server:
        with channel_to(server.grpc_address) as channel:
            yield channel


@pytest.fixture(scope="module")
def zeroserve(
    repos: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[grpc.Channel]:
    cache = tmp_path_factory.mktemp("cache")
    with serving(repos[0], cache, mode=ModelControlMode.EXPLICIT) as running:
        with channel_to(running.address) as channel:
            yield channel


def load(model: str, **parameters: tuple[str, object]) -> pb.RepositoryModelLoadRequest:
    request = pb.RepositoryModelLoadRequest(model_name=model)
    for key, (choice, value) in parameters.items():
        setattr(request.parameters[key], choice, value)
    return request


def unload(model: str, **parameters: tuple[str, object]) -> pb.RepositoryModelUnloadRequest:
    request = pb.RepositoryModelUnloadRequest(model_name=model)
    for key, (choice, value) in parameters.items():
        setattr(request.parameters[key], choice, value)
    return request


def same_rows(expected: Message, actual: Message) -> None:
    # A failed load's reason is each server's own error text.
    assert isinstance(expected, pb.RepositoryIndexResponse)
    assert isinstance(actual, pb.RepositoryIndexResponse)
    rows = [[(m.name, m.version, m.state) for m in r.models] for r in (expected, actual)]
    assert rows[1] == rows[0]


def same_batch_size(expected: Message, actual: Message) -> None:
    assert isinstance(expected, pb.ModelConfigResponse)
    assert isinstance(actual, pb.ModelConfigResponse)
    assert actual.config.max_batch_size == expected.config.max_batch_size == 4


def differs(case: Case, reason: str) -> object:
    return pytest.param(case, id=case.label, marks=pytest.mark.xfail(reason=reason, strict=True))


def step(label: str, method: str, request: Message, **options: object) -> Case:
    response_class = getattr(pb, method + "Response")
    return Case(label, method, request, response_class, **options)  # type: ignore[arg-type]


STEPS = [
    step("index before any load", "RepositoryIndex", pb.RepositoryIndexRequest()),
    step("index of ready models", "RepositoryIndex", pb.RepositoryIndexRequest(ready=True)),
    step("load", "RepositoryModelLoad", load("add_sub")),
    differs(
        step("load a model the repository lacks", "RepositoryModelLoad", load("nope")),
        "Triton answers INTERNAL \"failed to load 'nope', failed to poll from model "
        'repository"; zeroserve says the same words, then why, as a client error '
        "(INVALID_ARGUMENT)",
    ),
    # Each server says in its own words why its model failed; the code is the same.
    step("load a model that fails", "RepositoryModelLoad", load("broken"), same_text=False),
    step("index after loads", "RepositoryIndex", pb.RepositoryIndexRequest(), compare=same_rows),
    # Triton's gRPC checks the types of load parameters with texts of its own; zeroserve's
    # repository handler checks them for HTTP and gRPC alike, with the same code.
    step(
        "config override of the wrong type",
        "RepositoryModelLoad",
        load("add_sub", config=("bool_param", True)),
        same_text=False,
    ),
    step(
        "unknown load parameter",
        "RepositoryModelLoad",
        load("add_sub", bogus=("bool_param", True)),
        same_text=False,
    ),
    differs(
        step(
            "config override that is not JSON",
            "RepositoryModelLoad",
            load("add_sub", config=("string_param", "{not json")),
        ),
        "Triton 2.51 answers INTERNAL 'failed to poll from model repository'; zeroserve "
        "says the JSON does not parse (INVALID_ARGUMENT)",
    ),
    step(
        "config override",
        "RepositoryModelLoad",
        load("add_sub", config=("string_param", json.dumps(OVERRIDE))),
    ),
    step(
        "config after the override",
        "ModelConfig",
        pb.ModelConfigRequest(name="add_sub"),
        compare=same_batch_size,
    ),
    step(
        "load from a named repository",
        "RepositoryModelLoad",
        pb.RepositoryModelLoadRequest(model_name="add_sub", repository_name="x"),
    ),
    step(
        "unload from a named repository",
        "RepositoryModelUnload",
        pb.RepositoryModelUnloadRequest(model_name="add_sub", repository_name="x"),
    ),
    step(
        "unload_dependents of the wrong type",
        "RepositoryModelUnload",
        unload("add_sub", unload_dependents=("string_param", "x")),
        same_text=False,
    ),
    step("unload a model never loaded", "RepositoryModelUnload", unload("nope")),
    step("unload", "RepositoryModelUnload", unload("add_sub")),
    step("unload again", "RepositoryModelUnload", unload("add_sub")),
    step("ready after unload", "ModelReady", pb.ModelReadyRequest(name="add_sub")),
    step("metadata after unload", "ModelMetadata", pb.ModelMetadataRequest(name="add_sub")),
    step("infer after unload", "ModelInfer", pb.ModelInferRequest(model_name="add_sub")),
    step("statistics after unload", "ModelStatistics", pb.ModelStatisticsRequest(name="add_sub")),
]


@pytest.mark.parametrize("case", STEPS, ids=str)
def test_same_answer_as_triton(case: Case, triton: grpc.Channel, zeroserve: grpc.Channel) -> None:
    check(case, triton, zeroserve)
