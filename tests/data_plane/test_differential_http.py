"""The same HTTP requests to real Triton 2.51 and to zeroserve, both serving the same Triton
Python-backend models (the same model.py files, each server its own copy of the folder):
lookups of what is not there, model control, the config Triton prints, reshape, several
instance groups and model_warmup. Each scenario runs its steps in order on one pair of
servers; a step names what it compares.

Where zeroserve answers otherwise on purpose, the step says so and checks both answers:
a load Triton cannot poll is a 500 there and a 400 here (with Triton's words first); the
server stays ready here after a version failed to load, where Triton's strict readiness
turns it away for good.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from data_plane.settings import ModelControlMode
from foundation.proto import model_config_pb2 as mc
from tests.data_plane.server_app import data_plane
from tests.models import make_config
from tests.triton_oracle import (
    ADD_SUB_MODEL,
    IDENTITY_MODEL,
    TritonServer,
    triton_for,
    write_python_backend_model,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SERVER_ID = "edge-7"

SHAPES_MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            shape = np.array(x.shape, dtype=np.int64)
            rows = x.shape[0] if len(x.shape) > 2 else 1
            outputs = [
                pb_utils.Tensor("OUTPUT0", x),
                pb_utils.Tensor("SHAPE", np.tile(shape, (rows, 1)) if rows > 1 else shape),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""
"""Answers its input as it got it, and the shape it had inside the model."""

WARM_MODEL = """\
import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "warm.log")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            with open(self.log, "a") as log:
                values = [v.decode() if isinstance(v, bytes) else float(v) for v in x.flatten()]
                log.write(json.dumps({"shape": list(x.shape), "values": values}) + "\\n")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""
"""Logs every request it executes (warmup's among them) into its model folder."""


def _tensors(config: mc.ModelConfig, datatype: str, dims: list[int]) -> None:
    kind = f"TYPE_{'STRING' if datatype == 'BYTES' else datatype}"
    config.input.add(name="INPUT0", data_type=mc.DataType.Value(kind), dims=dims)
    config.output.add(name="OUTPUT0", data_type=mc.DataType.Value(kind), dims=dims)


def _warm(repo: Path, name: str, warmup: str, *, max_batch_size: int = 4, datatype="FP32"):
    config = mc.ModelConfig(name=name, max_batch_size=max_batch_size)
    _tensors(config, datatype, [3])
    config.instance_group.add(count=2, kind=mc.ModelInstanceGroup.KIND_CPU)
    model_dir = write_python_backend_model(repo, config, WARM_MODEL)
    text = (model_dir / "config.pbtxt").read_text()
    (model_dir / "config.pbtxt").write_text(text + f"\nmodel_warmup [{warmup}]\n")
    (model_dir / "warmup").mkdir()
    return model_dir


def _warmup(data: str, *, batch_size: int = 1, count: int = 1, datatype: str = "FP32") -> str:
    return (
        f'{{ name: "s" batch_size: {batch_size} count: {count} inputs {{ key: "INPUT0" '
        f"value: {{ data_type: TYPE_{datatype} dims: [3] {data} }} }} }}"
    )


def write_repository(repo: Path) -> None:
    """The models every scenario uses, in Triton's Python-backend form."""
    simple = make_config(
        "add_sub",
        max_batch_size=8,
        inputs=[("INPUT0", "FP32", [16]), ("INPUT1", "FP32", [16])],
        outputs=[("OUTPUT0", "FP32", [16]), ("OUTPUT1", "FP32", [16])],
    )
    write_python_backend_model(repo, simple, ADD_SUB_MODEL)
    for name in ("two_versions", "broken"):
        config = mc.ModelConfig(name=name)
        _tensors(config, "FP32", [4])
        source = IDENTITY_MODEL if name != "broken" else "this is not python(\n"
        write_python_backend_model(repo, config, source, version=1)
        if name == "two_versions":
            write_python_backend_model(repo, config, source, version=2)
    # Config errors Triton finds while polling the repository.
    for name, text in {
        "bad_text": "max_batch_size: oops",
        "negative_batch": "max_batch_size: -1",
        "wrong_name": 'name: "other"',
    }.items():
        config = mc.ModelConfig(name=name)
        _tensors(config, "FP32", [4])
        model_dir = write_python_backend_model(repo, config, IDENTITY_MODEL)
        lines = [
            line
            for line in (model_dir / "config.pbtxt").read_text().splitlines()
            if not line.startswith(("name:", "max_batch_size:"))
        ]
        (model_dir / "config.pbtxt").write_text("\n".join([text, *lines]) + "\n")
    # reshape: an input reshaped for the model, an output reshaped back for clients.
    config = mc.ModelConfig(name="reshaped_input", max_batch_size=8)
    config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[4]).reshape.shape.extend([2, 2])
    config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[2, 2])
    config.output.add(name="SHAPE", data_type=mc.TYPE_INT64, dims=[-1])
    write_python_backend_model(repo, config, SHAPES_MODEL)
    config = mc.ModelConfig(name="reshaped_variable")
    input_ = config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[-1, 6])
    input_.reshape.shape.extend([-1, 2, 3])
    output = config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[-1, 6])
    output.reshape.shape.extend([-1, 2, 3])
    config.output.add(name="SHAPE", data_type=mc.TYPE_INT64, dims=[-1])
    write_python_backend_model(repo, config, SHAPES_MODEL)
    config = mc.ModelConfig(name="reshape_too_big")
    config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[4]).reshape.shape.extend([3])
    config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[4])
    write_python_backend_model(repo, config, IDENTITY_MODEL)
    # Several instance groups.
    config = mc.ModelConfig(name="groups", max_batch_size=4)
    _tensors(config, "FP32", [4])
    config.instance_group.add(count=2, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.instance_group.add(count=3, kind=mc.ModelInstanceGroup.KIND_CPU, name="more")
    write_python_backend_model(repo, config, IDENTITY_MODEL)
    # model_warmup.
    _warm(repo, "warm_zero", _warmup("zero_data: true", batch_size=2, count=2))
    model_dir = _warm(repo, "warm_file", _warmup('input_data_file: "in0"'))
    (model_dir / "warmup" / "in0").write_bytes(np.array([1, 2, 3], "<f4").tobytes())
    model_dir = _warm(repo, "warm_short_file", _warmup('input_data_file: "in0"'))
    (model_dir / "warmup" / "in0").write_bytes(b"12345678")
    _warm(repo, "warm_missing_file", _warmup('input_data_file: "missing"'))
    _warm(repo, "warm_no_data", _warmup(""))
    _warm(repo, "warm_wrong_type", _warmup("zero_data: true", datatype="INT32"))
    _warm(
        repo,
        "warm_batch_without_batching",
        _warmup("zero_data: true", batch_size=2),
        max_batch_size=0,
    )
    _warm(repo, "warm_bytes", _warmup("zero_data: true", datatype="STRING"), datatype="BYTES")


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same repository twice: each server writes into its own (warmup logs)."""
    zeroserve_repo = tmp_path_factory.mktemp("zeroserve-repo")
    triton_repo = tmp_path_factory.mktemp("triton-repo")
    write_repository(zeroserve_repo)
    write_repository(triton_repo)
    return zeroserve_repo, triton_repo


@pytest.fixture(scope="module")
def triton(
    repos: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    log_dir = tmp_path_factory.mktemp("triton-log")
    with triton_for(repos[1], log_dir, "--model-control-mode=explicit", f"--id={SERVER_ID}") as s:
        yield s


@dataclass
class Pair:
    """One request to both servers, and what each answered."""

    triton: httpx.AsyncClient
    zeroserve: httpx.AsyncClient
    repos: tuple[Path, Path]

    async def send(self, method: str, path: str, body: Any = None) -> tuple[Answer, Answer]:
        answers = []
        for client, repo in ((self.triton, self.repos[1]), (self.zeroserve, self.repos[0])):
            response = await client.request(method, path, json=body)
            answers.append(Answer(response.status_code, response.text, repo))
        return answers[0], answers[1]

    async def same(self, method: str, path: str, body: Any = None) -> Answer:
        """Both answer the same status and the same JSON (or both nothing)."""
        expected, actual = await self.send(method, path, body)
        assert (actual.status, actual.document) == (expected.status, expected.document), (
            f"{method} {path}: Triton {expected}, zeroserve {actual}"
        )
        return actual


@dataclass
class Answer:
    status: int
    text: str
    repo: Path

    @property
    def document(self) -> Any:
        if not self.text:
            return None
        # Paths in texts name each server's own copy of the repository.
        return json.loads(self.text.replace(str(self.repo), "<repo>"))

    @property
    def error(self) -> str:
        return str(self.document["error"])


@pytest.fixture
async def pair(
    triton: TritonServer, repos: tuple[Path, Path], tmp_path: Path
) -> AsyncIterator[Pair]:
    async with (
        data_plane(repos[0], tmp_path / "cache", server_id=SERVER_ID) as zeroserve,
        httpx.AsyncClient(base_url=triton.http_url, timeout=60.0) as triton_client,
    ):
        yield Pair(triton_client, zeroserve, repos)


def _infer(values: list[float], shape: list[int], name: str = "INPUT0") -> dict[str, Any]:
    return {"inputs": [{"name": name, "datatype": "FP32", "shape": shape, "data": values}]}


async def test_lookups_and_model_control_answer_as_triton(pair: Pair):
    # --id names both (versions and extensions are each server's own).
    expected, actual = await pair.send("GET", "/v2")
    assert expected.document["name"] == actual.document["name"] == SERVER_ID
    await pair.same("GET", "/v2/health/ready")
    for path in ("/v2/models/nope", "/v2/models/nope/config", "/v2/models/nope/ready"):
        await pair.same("GET", path)
    await pair.same("GET", "/v2/models/nope/versions/1/ready")
    await pair.same("POST", "/v2/models/nope/infer", _infer([1.0], [1]))
    await pair.same("POST", "/v2/repository/models/nope/unload")
    # Not yet loaded: as unknown as a model the repository lacks.
    await pair.same("GET", "/v2/models/add_sub")
    await pair.same("GET", "/v2/models/add_sub/ready")

    # A load that cannot read the model: Triton's words, then why; a client error here.
    for name in ("nope", "bad_text", "negative_batch", "wrong_name"):
        expected, actual = await pair.send("POST", f"/v2/repository/models/{name}/load")
        assert (expected.status, actual.status) == (500, 400), name
        assert expected.error == f"failed to load '{name}', failed to poll from model repository"
        assert actual.error.startswith(expected.error + ": "), actual.error
    await pair.same("GET", "/v2/health/ready")  # Triton stays ready after those

    expected, actual = await pair.send("POST", "/v2/repository/models/add_sub/load")
    assert expected.status == actual.status == 200
    await pair.same("GET", "/v2/models/add_sub")
    expected, actual = await pair.send("GET", "/v2/models/add_sub/config")
    assert actual.text == expected.text  # to the byte: same fields, defaults and order
    await pair.same("GET", "/v2/models/add_sub/versions/7/ready")
    await pair.same("GET", "/v2/models/add_sub/versions/7")
    await pair.same("POST", "/v2/models/add_sub/versions/7/infer", _infer([1.0], [1, 1]))

    expected, actual = await pair.send("POST", "/v2/repository/models/two_versions/load")
    assert expected.status == actual.status == 200
    await pair.same("GET", "/v2/models/two_versions/versions/1")
    await pair.same("GET", "/v2/models/two_versions/versions/1/ready")
    await pair.same("GET", "/v2/models/two_versions/versions/2/ready")
    await pair.same("POST", "/v2/repository/models/two_versions/unload")
    await pair.same("GET", "/v2/models/two_versions")
    await pair.same("GET", "/v2/models/two_versions/versions/2")
    await pair.same("GET", "/v2/models/two_versions/versions/2/ready")
    await pair.same("GET", "/v2/models/two_versions/config")
    await pair.same("POST", "/v2/models/two_versions/infer", _infer([1.0] * 4, [4]))
    await pair.same("GET", "/v2/models/two_versions/stats")

    # A version that fails to load: the same words and the same index row.
    await pair.same("POST", "/v2/repository/models/broken/load")
    await pair.same("GET", "/v2/models/broken")
    await pair.same("GET", "/v2/models/broken/versions/1")
    # Triton answers an unload before the version is gone (UNLOADING a while), zeroserve
    # once it is: compare the index once Triton's has settled.
    for _ in range(600):
        index = (await pair.triton.post("/v2/repository/index")).json()
        if all(row.get("state") != "UNLOADING" for row in index):
            break
        await asyncio.sleep(0.05)
    await pair.same("POST", "/v2/repository/index")
    # Triton's strict readiness now turns the whole server away; zeroserve stays ready,
    # since every model it serves still serves (a probe must not pull a healthy worker).
    expected, actual = await pair.send("GET", "/v2/health/ready")
    assert (expected.status, actual.status) == (400, 200)


async def test_reshape_answers_as_triton(pair: Pair):
    for name in ("reshaped_input", "reshaped_variable"):
        expected, actual = await pair.send("POST", f"/v2/repository/models/{name}/load")
        assert expected.status == actual.status == 200, (expected, actual)
        await pair.same("GET", f"/v2/models/{name}")
        await pair.same("GET", f"/v2/models/{name}/config")
    answer = await pair.same(
        "POST", "/v2/models/reshaped_input/infer", _infer([float(v) for v in range(8)], [2, 4])
    )
    assert answer.document["outputs"][0]["shape"] == [2, 2, 2]
    # Clients send the dims, not the reshape. The note's last words are another Triton
    # release's in zeroserve (for every shape error, not only here).
    expected, actual = await pair.send(
        "POST", "/v2/models/reshaped_input/infer", _infer([1.0] * 8, [2, 2, 2])
    )
    assert expected.status == actual.status == 400
    common = "See the model configuration docs for "
    assert actual.error.split(common)[0] == expected.error.split(common)[0]
    answer = await pair.same(
        "POST", "/v2/models/reshaped_variable/infer", _infer([float(v) for v in range(18)], [3, 6])
    )
    assert answer.document["outputs"][0]["shape"] == [3, 6]
    expected, actual = await pair.send("POST", "/v2/repository/models/reshape_too_big/load")
    assert expected.status == actual.status == 400
    # Triton checks reshapes as it loads a version, zeroserve as it reads the config: the
    # same rule and text, each in its own wording of a failed load.
    tail = "model input 'INPUT0' has different size for dims and reshape for reshape_too_big"
    assert expected.error.endswith(f"Invalid argument: {tail};\n")
    assert actual.error.endswith(tail)


async def test_instance_groups_are_filled_as_triton_fills_them(pair: Pair):
    expected, actual = await pair.send("POST", "/v2/repository/models/groups/load")
    assert expected.status == actual.status == 200
    answer = await pair.same("GET", "/v2/models/groups/config")
    assert [(g["name"], g["count"]) for g in answer.document["instance_group"]] == [
        ("groups_0", 2),
        ("more", 3),
    ]
    await pair.same("POST", "/v2/models/groups/infer", _infer([1.0] * 8, [2, 4]))


@pytest.mark.parametrize(
    "name",
    [
        "warm_zero",
        "warm_file",
        "warm_bytes",
        "warm_short_file",
        "warm_missing_file",
        "warm_no_data",
        "warm_wrong_type",
    ],
)
async def test_warmup_runs_and_fails_as_in_triton(pair: Pair, name: str):
    expected, actual = await pair.send("POST", f"/v2/repository/models/{name}/load")
    assert expected.status == actual.status
    if expected.status != 200:
        assert actual.error == expected.error
        return
    # Every instance ran every sample, count times, with the same data (as separate
    # requests, Triton's Python backend's way).
    logs = [
        sorted((repo / name / "warm.log").read_text().splitlines()) for repo in pair.repos[::-1]
    ]
    assert logs[1] == logs[0]
    assert logs[0]


async def test_a_warmup_batch_a_model_cannot_take_fails_its_load_in_tritons_words(pair: Pair):
    """Triton 2.51 dies of signal 11 loading this model in about half the runs after other
    loads (its log shows the crash), so zeroserve is held to the text Triton gives when it
    survives: "failed to load 'warm_batch_without_batching' version 1: Invalid argument:
    failed to run warmup sample 's': batch size 2 for 'warm_batch_without_batching_0_0', max
    allowed is 0; " once per instance the sample failed on (zeroserve says it once)."""
    name = "warm_batch_without_batching"
    answer = await pair.zeroserve.post(f"/v2/repository/models/{name}/load")
    assert answer.status_code == 400
    error = answer.json()["error"]
    head = f"failed to run warmup sample 's': batch size 2 for '{name}"
    assert head in error and "', max allowed is 0;" in error, error


TAGGED_MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils

TAG = {tag}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            tag = np.full(x.shape, TAG, dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", tag)]))
        return responses
"""
"""Answers its tag, whatever it is sent."""

POLL_WAIT_S = 60.0


def write_tagged(repo: Path, name: str, tag: float, *, version: int = 1) -> Path:
    config = mc.ModelConfig(name=name)
    _tensors(config, "FP32", [1])
    return write_python_backend_model(repo, config, TAGGED_MODEL.format(tag=tag), version=version)


def edit(path: Path, text: str) -> None:
    """Write ``path`` with a modification time later than any scan could have seen."""
    path.write_text(text)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2 * 10**9))


@pytest.fixture(scope="module")
def poll_repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    repos = (tmp_path_factory.mktemp("zeroserve-poll"), tmp_path_factory.mktemp("triton-poll"))
    for repo in repos:
        write_tagged(repo, "p_a", 1.0)
    return repos


@pytest.fixture
async def poll_pair(
    poll_repos: tuple[Path, Path], tmp_path: Path
) -> AsyncIterator[tuple[Pair, TritonServer]]:
    log_dir = tmp_path / "triton-log"
    log_dir.mkdir()
    flags = ("--model-control-mode=poll", "--repository-poll-secs=1")
    with triton_for(poll_repos[1], log_dir, *flags) as server:
        async with (
            data_plane(
                poll_repos[0],
                tmp_path / "cache",
                mode=ModelControlMode.POLL,
                repository_poll_s=0.2,
            ) as zeroserve,
            httpx.AsyncClient(base_url=server.http_url, timeout=60.0) as triton_client,
        ):
            yield Pair(triton_client, zeroserve, poll_repos), server


async def _converge(pair: Pair, what: str, path: str, body: Any, check: Any) -> None:
    """Wait until both servers answer ``path`` as ``check`` wants (each polls on its own
    clock), bounded."""
    for _ in range(int(POLL_WAIT_S / 0.1)):
        answers = await pair.send("POST" if body is not None else "GET", path, body)
        if all(check(answer) for answer in answers):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: the servers did not get there within {POLL_WAIT_S} s: {answers}")


def _tag(expected: float, version: str = "1") -> Any:
    def check(answer: Answer) -> bool:
        if answer.status != 200:
            return False
        document = answer.document
        return bool(
            document["model_version"] == version and document["outputs"][0]["data"] == [expected]
        )

    return check


async def test_poll_mode_follows_the_repository_as_triton_does(
    poll_pair: tuple[Pair, TritonServer], caplog: pytest.LogCaptureFixture
):
    pair, triton = poll_pair
    caplog.set_level(logging.WARNING, logger="data_plane.poll")
    one = _infer([0.0], [1])
    await _converge(pair, "start-up", "/v2/models/p_a/infer", one, _tag(1.0))
    await pair.same("GET", "/v2/health/ready")
    refused = await pair.same("POST", "/v2/repository/models/p_a/load")
    assert refused.status == 503

    for repo in pair.repos:
        write_tagged(repo, "p_b", 2.0)
    await _converge(pair, "a new model", "/v2/models/p_b/infer", one, _tag(2.0))

    for repo in pair.repos:
        edit(repo / "p_a" / "1" / "model.py", TAGGED_MODEL.format(tag=3.0))
    await _converge(pair, "a changed model", "/v2/models/p_a/infer", one, _tag(3.0))

    for repo in pair.repos:
        write_tagged(repo, "p_a", 4.0, version=2)
    await _converge(pair, "a new version", "/v2/models/p_a/infer", one, _tag(4.0, "2"))
    await _converge(
        pair,
        "version 1 unloaded",
        "/v2/repository/index",
        {},
        lambda answer: (
            {"name": "p_a", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
            in answer.document
        ),
    )
    await pair.same("POST", "/v2/repository/index")

    # A broken config: both keep serving what they had, and stay ready.
    for repo in pair.repos:
        config = repo / "p_a" / "config.pbtxt"
        edit(config, config.read_text() + "\nnot_a_field: 1\n")
    for _ in range(int(POLL_WAIT_S / 0.1)):
        if "poll: load of p_a failed" in caplog.text and (
            "Poll failed for model directory 'p_a'" in triton.log()
        ):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"a poller did not see the broken config:\n{caplog.text}")
    await pair.same("POST", "/v2/models/p_a/infer", one)
    await pair.same("GET", "/v2/health/ready")
    await pair.same("GET", "/v2/models/p_a/ready")

    for repo in pair.repos:
        shutil.rmtree(repo / "p_b")
    await _converge(
        pair, "a removed model", "/v2/models/p_b/ready", None, lambda a: a.status == 400
    )
    await pair.same("POST", "/v2/models/p_b/infer", one)
    await pair.same("POST", "/v2/repository/index")
