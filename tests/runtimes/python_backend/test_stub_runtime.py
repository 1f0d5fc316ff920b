"""Triton Python-backend models through PythonRuntime, each instance in a real stub
process: Triton's execute contract and texts, load errors, auto-complete, crashes,
timeouts, unload freeing the process, and EXECUTION_ENV_PATH."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from foundation import model_config
from foundation.proto import model_config_pb2 as mc
from runtimes.base import RuntimeOptions, RuntimeState
from runtimes.errors import (
    InternalError,
    InvalidArgumentError,
    ModelLoadError,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
)
from runtimes.model_request import ModelRequest, RequestContext
from runtimes.python_model import PythonRuntime
from tests.models import state_of
from tests.runtimes.python_backend.triton_models import THREADS_MODEL, write_model

pytestmark = pytest.mark.anyio

ONE = {"INPUT0": np.ones(1, dtype=np.float32)}
WHO = ("PID", "INSTANCE")


def _config(model_dir: Path, **parameters: str) -> mc.ModelConfig:
    config = model_config.read_config_file(model_dir)
    assert config is not None
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    PythonRuntime.complete_config(model_dir / "1", config)
    model_config.normalize(config, name=model_dir.name, gpu_count=0)
    return config


async def _load(model_dir: Path, **parameters: str) -> PythonRuntime:
    runtime = PythonRuntime(name=model_dir.name, version=1, options=RuntimeOptions())
    await runtime.load(model_dir / "1", _config(model_dir, **parameters), "cpu")
    return runtime


@pytest.fixture
async def loaded(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[PythonRuntime]:
    runtime = await _load(write_model(tmp_path, request.param))
    try:
        yield runtime
    finally:
        await runtime.unload()


def _requests(*contexts: RequestContext, inputs: dict[str, np.ndarray] = ONE) -> list[ModelRequest]:
    return [ModelRequest(inputs, context) for context in contexts]


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("loaded", ["add_sub"], indirect=True)
async def test_add_sub_runs_in_a_stub(loaded: PythonRuntime):
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([1, 1, 1, 1], dtype=np.float32)
    out = await loaded.infer({"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    assert loaded.resolve_capabilities().requests is not None


@pytest.mark.parametrize("loaded", ["batched"], indirect=True)
async def test_one_response_per_request_and_errors_fail_only_their_request(
    loaded: PythonRuntime,
):
    executor = loaded.resolve_capabilities().requests
    assert executor is not None
    rows = np.array([[1, 2], [3, 4]], dtype=np.float32)
    outcomes = await executor.execute_requests(
        [
            ModelRequest({"INPUT0": rows}, RequestContext(request_id="a")),
            ModelRequest(
                {"INPUT0": -rows[:1]},
                RequestContext(request_id="b", parameters={"error_code": "INVALID_ARG"}),
            ),
            ModelRequest(
                {"INPUT0": rows[1:]},
                RequestContext(request_id="c", requested_outputs=("OUTPUT0", "REQUESTS")),
            ),
        ]
    )
    first, second, third = outcomes
    assert isinstance(first, dict) and not first  # asked for no outputs: all pruned
    assert isinstance(second, InvalidArgumentError)
    assert second.message == "negative input in request b"
    assert isinstance(third, dict)
    np.testing.assert_array_equal(third["OUTPUT0"], rows[1:] * 2)
    np.testing.assert_array_equal(third["REQUESTS"], [[3]])


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("INTERNAL", InternalError),
        ("NOT_FOUND", NotFoundError),
        ("INVALID_ARG", InvalidArgumentError),
        ("UNAVAILABLE", UnavailableError),
        ("UNSUPPORTED", UnsupportedError),
        ("ALREADY_EXISTS", InvalidArgumentError),
        ("CANCELLED", InvalidArgumentError),
        ("UNKNOWN", InvalidArgumentError),
    ],
)
@pytest.mark.parametrize("loaded", ["batched"], indirect=True)
async def test_error_codes_map_to_tritons_statuses(
    loaded: PythonRuntime, code: str, kind: type[Exception]
):
    executor = loaded.resolve_capabilities().requests
    assert executor is not None
    (outcome,) = await executor.execute_requests(
        _requests(
            RequestContext(request_id="r", parameters={"error_code": code}),
            inputs={"INPUT0": -np.ones((1, 2), np.float32)},
        )
    )
    assert type(outcome) is kind


@pytest.mark.parametrize("loaded", ["request_info"], indirect=True)
async def test_request_and_initialize_as_triton_gives_them(loaded: PythonRuntime):
    executor = loaded.resolve_capabilities().requests
    assert executor is not None
    context = RequestContext(
        request_id="req-7",
        correlation_id=42,
        parameters={"z": 1, "a": "\u00fc", "f": 1.5},
        requested_outputs=("PARAMETERS", "ID", "CORRELATION", "REQUESTED", "ARGS"),
    )
    (outcome,) = await executor.execute_requests(_requests(context))
    assert isinstance(outcome, dict)
    text = {name: array[0].decode() for name, array in outcome.items()}
    assert text["ID"] == "req-7"
    assert text["CORRELATION"] == "42"
    assert text["PARAMETERS"] == '{"z":1,"a":"\u00fc","f":1.5}'
    assert text["REQUESTED"] == "ARGS,CORRELATION,ID,PARAMETERS,REQUESTED"
    args = json.loads(text["ARGS"])
    # Triton's keys of the config JSON ("optimization" is Triton's filled-in default).
    assert {
        "backend", "batch_input", "batch_output", "cc_model_filenames",
        "default_model_filename", "input", "instance_group", "max_batch_size", "metric_tags",
        "model_warmup", "name", "output", "parameters", "platform", "runtime",
        "version_policy",
    } <= set(args.pop("model_config"))  # fmt: skip
    assert args == {
        "model_instance_device_id": "0",
        "model_instance_kind": "CPU",
        "model_instance_name": "request_info_0_0",
        "model_name": "request_info",
        "model_repository": "request_info",
        "model_version": "1",
    }
    # The model's order, not the request's: as Triton answers.
    assert list(outcome) == ["ID", "CORRELATION", "PARAMETERS", "REQUESTED", "ARGS"]


@pytest.mark.parametrize(
    ("model", "message"),
    [
        pytest.param(
            "execute_raises",
            "Failed to process the request(s) for model 'execute_raises_0_0', message: "
            "ValueError: this model cannot execute\n\nAt:\n  {path}(7): execute\n",
            id="raises",
        ),
        pytest.param(
            "wrong_count",
            "Failed to process the request(s) for model 'wrong_count_0_0', message: Number of "
            "InferenceResponse objects do not match the number of InferenceRequest objects. "
            "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0\n",
            id="wrong-count",
        ),
        pytest.param(
            "not_a_list",
            "Failed to process the request(s) for model 'not_a_list_0_0', message: Expected a "
            "list in the execute return, found type '<class 'str'>'.",
            id="not-a-list",
        ),
    ],
)
async def test_a_failed_execute_fails_the_batch_with_tritons_text(
    tmp_path: Path, model: str, message: str
):
    model_dir = write_model(tmp_path, model)
    runtime = await _load(model_dir)
    try:
        with pytest.raises(InternalError) as raised:
            await runtime.infer(ONE)
        assert raised.value.message == message.format(path=model_dir / "1" / "model.py")
        # The instance lives on: a failed execute is not a failed model.
        assert state_of(runtime) is RuntimeState.READY
        with pytest.raises(InternalError):
            await runtime.infer(ONE)
    finally:
        await runtime.unload()


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        pytest.param(
            "init_error",
            "RuntimeError: cannot initialize init_error\n\nAt:\n  {path}(7): initialize\n",
            id="initialize-raises",
        ),
        pytest.param(
            "syntax_error", "SyntaxError: expected ':' (model.py, line 6)", id="syntax-error"
        ),
    ],
)
async def test_load_errors_read_as_tritons(tmp_path: Path, model: str, reason: str):
    model_dir = write_model(tmp_path, model)
    with pytest.raises(ModelLoadError) as raised:
        await _load(model_dir)
    expected = reason.format(path=model_dir / "1" / "model.py")
    assert raised.value.message == (
        f"load failed for model '{model}': version 1 is at UNAVAILABLE state: "
        f"Internal: {expected};\n"
    )


async def test_a_missing_model_class_is_a_load_error(tmp_path: Path):
    model_dir = write_model(tmp_path, "add_sub", as_name="no_class")
    (model_dir / "1" / "model.py").write_text(
        "import triton_python_backend_utils as pb_utils\n\nclass Model:\n    pass\n"
    )
    with pytest.raises(ModelLoadError, match="module '1.model' has no attribute"):
        await _load(model_dir)


async def test_auto_complete_config_fills_the_configuration(tmp_path: Path):
    model_dir = write_model(tmp_path, "auto_complete")
    config = _config(model_dir)
    assert config.max_batch_size == 4
    assert config.HasField("dynamic_batching")
    assert [(t.name, list(t.dims)) for t in config.input] == [("INPUT0", [4]), ("INPUT1", [4])]
    assert [t.name for t in config.output] == ["OUTPUT0", "OUTPUT1"]
    runtime = PythonRuntime(name="auto_complete", version=1, options=RuntimeOptions())
    await runtime.load(model_dir / "1", config, "cpu")
    try:
        x = np.ones((2, 4), np.float32)
        out = await runtime.infer({"INPUT0": x, "INPUT1": x})
        np.testing.assert_array_equal(out["OUTPUT0"], x * 2)
    finally:
        await runtime.unload()


async def test_auto_complete_errors_are_load_errors(tmp_path: Path):
    model_dir = write_model(tmp_path, "auto_complete", as_name="bad_auto")
    path = model_dir / "1" / "model.py"
    path.write_text(path.read_text().replace("set_max_batch_size(4)", "set_max_batch_size(-1)"))
    (model_dir / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 2\n')
    with pytest.raises(ModelLoadError, match="configuration specified max_batch_size 2"):
        _config(model_dir)


async def test_a_crash_fails_its_requests_and_reports_the_failure(tmp_path: Path):
    runtime = await _load(write_model(tmp_path, "crash"))
    failures: list[str] = []
    reporter = runtime.resolve_capabilities().failure
    assert reporter is not None
    reporter.on_failure(failures.append)
    try:
        with pytest.raises(InternalError) as raised:
            await runtime.infer(ONE)
        assert raised.value.message == "Stub process 'crash_0_0' is not healthy."
        assert failures == ["Stub process 'crash_0_0' is not healthy."]
        assert state_of(runtime) is RuntimeState.FAILED
    finally:
        await runtime.unload()
    assert state_of(runtime) is RuntimeState.UNLOADED


async def test_an_execute_past_its_timeout_stops_the_stub(tmp_path: Path):
    runtime = await _load(write_model(tmp_path, "sleepy"), execute_timeout_s="0.5")
    failures: list[str] = []
    reporter = runtime.resolve_capabilities().failure
    assert reporter is not None
    reporter.on_failure(failures.append)
    try:
        with pytest.raises(InternalError, match="did not finish execute within 0.5 s"):
            await runtime.infer({"INPUT0": np.array([60], np.float32)})
        assert len(failures) == 1
    finally:
        await runtime.unload()


async def test_instances_are_processes_of_their_own_and_unload_ends_them(tmp_path: Path):
    runtime = await _load(write_model(tmp_path, "whoami"))
    executor = runtime.resolve_capabilities().requests
    assert executor is not None
    try:
        outcomes = await asyncio.gather(
            executor.execute_requests(_requests(RequestContext(requested_outputs=WHO))),
            executor.execute_requests(_requests(RequestContext(requested_outputs=WHO))),
        )
        pids = {int(o[0]["PID"][0]) for o in outcomes if isinstance(o[0], dict)}
        names = {o[0]["INSTANCE"][0] for o in outcomes if isinstance(o[0], dict)}
    finally:
        await runtime.unload()
    assert names == {b"whoami_0_0", b"whoami_0_1"}
    assert len(pids) == 2 and os.getpid() not in pids
    assert not any(_alive(pid) for pid in pids)


async def test_is_cancelled_asks_the_server(tmp_path: Path):
    runtime = await _load(write_model(tmp_path, "whoami"))
    executor = runtime.resolve_capabilities().requests
    assert executor is not None
    try:
        outcomes = await executor.execute_requests(
            _requests(
                RequestContext(is_cancelled=lambda: True, requested_outputs=("CANCELLED",)),
                RequestContext(is_cancelled=lambda: False, requested_outputs=("CANCELLED",)),
            )
        )
    finally:
        await runtime.unload()
    assert [o["CANCELLED"][0] for o in outcomes if isinstance(o, dict)] == [True, False]


async def test_model_logs_reach_the_server_log(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    runtime = await _load(write_model(tmp_path, "whoami"))
    executor = runtime.resolve_capabilities().requests
    assert executor is not None
    try:
        with caplog.at_level(logging.INFO, logger="runtimes.python_backend.process"):
            await executor.execute_requests(_requests(RequestContext(request_id="logged")))
            # The log line travels on the channel ahead of the result; both were read.
    finally:
        await runtime.unload()
    assert any("whoami served logged" in r.getMessage() for r in caplog.records)


async def test_a_leaking_models_memory_goes_with_its_process(tmp_path: Path):
    runtime = await _load(write_model(tmp_path, "leaky"))
    whoami = await _load(write_model(tmp_path, "whoami"))
    try:
        for _ in range(4):
            await runtime.infer(ONE)
        # The leaky stub's pid, found among this process's children by its size.
        children = _children(os.getpid())
        big = [pid for pid in children if _rss_bytes(pid) > 200 * 1024 * 1024]
        assert len(big) == 1
    finally:
        await runtime.unload()
        await whoami.unload()
    assert not _alive(big[0])


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def env_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whoami model with, in its folder, a virtualenv seeing this Python's packages
    (numpy), made as Triton's documentation makes one, and the same packed as a .tar.gz."""
    model_dir = write_model(tmp_path_factory.mktemp("env"), "whoami")
    venv = model_dir / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
        timeout=120,
    )
    with tarfile.open(model_dir / "env.tar.gz", "w:gz") as packed:
        packed.add(venv, arcname=".")
    return model_dir


async def test_execution_env_path_runs_the_stub_in_that_environment(env_model: Path):
    runtime = await _load(env_model, EXECUTION_ENV_PATH="$$TRITON_MODEL_DIRECTORY/venv")
    try:
        out = await runtime.infer(ONE)
    finally:
        await runtime.unload()
    assert out["PREFIX"][0].decode() == str(env_model / "venv")


async def test_an_environment_outside_the_model_folder_is_refused(env_model: Path, tmp_path: Path):
    (tmp_path / "elsewhere").symlink_to(env_model / "venv")
    model_dir = write_model(tmp_path, "whoami")
    with pytest.raises(ModelLoadError, match="outside the model's folder"):
        await _load(model_dir, EXECUTION_ENV_PATH=str(tmp_path / "elsewhere"))


async def test_a_packed_environment_is_extracted_and_used(env_model: Path):
    runtime = await _load(env_model, EXECUTION_ENV_PATH="$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    try:
        out = await runtime.infer(ONE)
    finally:
        await runtime.unload()
    prefix = Path(out["PREFIX"][0].decode())
    assert prefix.parent.name == "zeroserve-python-envs"
    assert (prefix / "bin" / "activate").is_file()


async def test_an_environment_without_numpy_is_a_clear_load_error(tmp_path: Path):
    model_dir = write_model(tmp_path, "whoami")
    await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "venv", "--without-pip", str(model_dir / "bare")],
        check=True,
    )
    with pytest.raises(ModelLoadError, match="cannot run the stub: ModuleNotFoundError"):
        await _load(model_dir, EXECUTION_ENV_PATH="$$TRITON_MODEL_DIRECTORY/bare")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(
            "/no/such/env", "Failed to get the canonical path for /no/such/env.", id="missing"
        ),
        pytest.param(
            "/usr",
            "EXECUTION_ENV_PATH /usr resolves to /usr, outside the model's folder {model}; put "
            "the environment in the model's folder and name it as $$TRITON_MODEL_DIRECTORY/...",
            id="outside",
        ),
        pytest.param(
            "$$TRITON_MODEL_DIRECTORY/1",
            "Path {model}/1/bin/activate does not exist. The Python environment should "
            "contain an 'activate' script.",
            id="no-activate",
        ),
    ],
)
async def test_bad_execution_env_paths_are_refused(tmp_path: Path, value: str, message: str):
    model_dir = write_model(tmp_path, "whoami")
    with pytest.raises(ModelLoadError) as raised:
        await _load(model_dir, EXECUTION_ENV_PATH=value)
    assert raised.value.reason == message.format(model=model_dir.resolve())


async def test_bad_limit_parameters_are_refused(tmp_path: Path):
    with pytest.raises(ModelLoadError, match="execute_timeout_s must be positive"):
        await _load(write_model(tmp_path, "whoami"), execute_timeout_s="-1")


def _policies(pid: int) -> dict[int, int]:
    """Each thread of ``pid`` and its scheduling policy (field 41 of its stat)."""
    policies = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        # The name (field 2) is in parentheses and may hold spaces; fields follow it.
        fields = stat[stat.rindex(")") + 2 :].split()
        policies[int(task.name)] = int(fields[41 - 3])
    return policies


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="needs Linux scheduling policies")
@pytest.mark.parametrize(("parameter", "lowered"), [(None, True), ("normal", False)])
async def test_the_models_native_threads_run_at_idle_priority(
    tmp_path: Path, parameter: str | None, lowered: bool
):
    parameters = {} if parameter is None else {"native_threads": parameter}
    folder = tmp_path / "threads"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(THREADS_MODEL.config.format(name="threads"))
    (folder / "1" / "model.py").write_text(THREADS_MODEL.source)
    runtime = await _load(folder, **parameters)
    try:
        answer = await runtime.infer(ONE)
        pid = int(answer["PID"][0])
        python_threads = {int(t) for t in answer["PYTHON_THREADS"]}
        policies = _policies(pid)
    finally:
        await runtime.unload()
    native = set(policies) - python_threads
    # The main thread, the parent watch and the model's own thread; ONNX Runtime's pool.
    assert len(python_threads) >= 3 and pid in python_threads
    assert native
    assert {policies[t] for t in python_threads} == {os.SCHED_OTHER}
    expected = os.SCHED_IDLE if lowered else os.SCHED_OTHER
    assert {policies[t] for t in native} == {expected}


async def test_a_native_threads_value_other_than_idle_or_normal_is_refused(tmp_path: Path):
    with pytest.raises(ModelLoadError, match="native_threads must be idle or normal, not 'low'"):
        await _load(write_model(tmp_path, "whoami"), native_threads="low")
