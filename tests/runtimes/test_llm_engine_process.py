"""The transformers engine's own process: it serves, it goes with unload, a crash fails the
requests and marks the engine dead, and it never outlives the server's end of the socket."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from foundation import model_config
from runtimes.base import RuntimeOptions, RuntimeState
from runtimes.errors import EngineDeadError, InternalError, ModelLoadError
from runtimes.llm.engine_process.client import SpareEngines
from runtimes.llm.engine_process.messages import LoadModel, Ready
from runtimes.llm.hf import OPTIONS, TransformersRuntime
from runtimes.llm.parameters import read_parameters
from runtimes.sampling import SamplingParams
from tests.llm_model import load_runtime, prompt, write_tiny_llm

pytestmark = pytest.mark.anyio

WAIT_S = 60.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llm(tmp_path_factory.mktemp("repo"), "tiny")


def _engine_pid(runtime: TransformersRuntime) -> int:
    process = runtime._process
    assert process is not None
    return process.pid


def _is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_the_engine_runs_in_its_own_process_and_goes_with_unload(model_dir: Path) -> None:
    runtime = await load_runtime(model_dir)
    try:
        pid = _engine_pid(runtime)
        assert pid != os.getpid() and _is_alive(pid)
        ids = await runtime.encode(prompt("the", "cat"))
        completion = await runtime.complete(ids, SamplingParams(max_tokens=8, temperature=0.0))
        assert completion.completion_tokens == 8 or completion.finish_reason == "stop"
    finally:
        await runtime.unload()
    assert runtime.state is RuntimeState.UNLOADED
    assert not _is_alive(pid)


async def test_a_crashed_engine_fails_its_requests_and_reads_as_dead(model_dir: Path) -> None:
    runtime = await load_runtime(model_dir)
    try:
        ids = await runtime.encode(prompt("the"))
        stream = runtime.generate(ids, SamplingParams(max_tokens=200, temperature=0.0))
        async with contextlib.aclosing(stream):
            await stream.__anext__()
            os.kill(_engine_pid(runtime), signal.SIGKILL)
            with pytest.raises((EngineDeadError, InternalError), match="engine"):
                async with asyncio.timeout(WAIT_S):
                    async for _ in stream:
                        pass
        assert runtime.is_dead
        with pytest.raises(EngineDeadError):
            await runtime.complete(ids, SamplingParams(max_tokens=4, temperature=0.0))
    finally:
        await runtime.unload()


async def test_a_stalled_engine_never_blocks_the_event_loop(model_dir: Path) -> None:
    """Sends that the stopped engine cannot take (megabytes: more than the socket buffers)
    queue on the sender thread; the loop goes on, and the engine catches up once resumed."""
    runtime = await load_runtime(model_dir)
    pid = _engine_pid(runtime)
    process = runtime._process
    assert process is not None
    resumed = threading.Event()

    def resume() -> None:
        # Fails safe: were the loop blocked in a send, this frees it.
        resumed.set()
        os.kill(pid, signal.SIGCONT)

    watchdog = threading.Timer(WAIT_S, resume)
    os.kill(pid, signal.SIGSTOP)
    watchdog.start()
    try:
        for index in range(64):
            process.cancel(f"{index}-" + "x" * 32_768)  # unknown ids: no-ops in the engine
            await asyncio.sleep(0)  # one message per loop iteration
        assert not resumed.is_set(), "the event loop was blocked by a send"
    finally:
        watchdog.cancel()
        os.kill(pid, signal.SIGCONT)
    try:
        ids = await runtime.encode(prompt("the", "moon"))
        async with asyncio.timeout(WAIT_S):
            completion = await runtime.complete(ids, SamplingParams(max_tokens=4, temperature=0))
        assert completion.completion_tokens > 0
    finally:
        await runtime.unload()


async def test_a_folder_the_engine_cannot_load_fails_the_load_with_its_reason(
    model_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "1"
    broken.mkdir()
    for path in (model_dir / "1").iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    # A tokenizer the server can read and weights the engine cannot.
    next(broken.glob("*.safetensors")).write_bytes(b"not a safetensors file")
    config = model_config.read_config_file(model_dir)
    assert config is not None
    runtime = TransformersRuntime(name="tiny", version=1, options=RuntimeOptions())
    with pytest.raises(ModelLoadError, match="cannot load"):
        await runtime.load(broken, config, "cpu")
    assert runtime.state is RuntimeState.FAILED


async def test_a_reload_takes_the_spare_process_and_close_stops_the_next(model_dir: Path) -> None:
    spares = SpareEngines()
    try:
        assert spares.pid is None  # nothing before an LLM is loaded
        runtime = await load_runtime(model_dir, spares=spares)
        first = _engine_pid(runtime)
        await runtime.unload()
        assert not _is_alive(first)
        await _until(lambda: spares.pid is not None)
        spare = spares.pid
        runtime = await load_runtime(model_dir, spares=spares)
        try:
            assert _engine_pid(runtime) == spare
            ids = await runtime.encode(prompt("the"))
            completion = await runtime.complete(ids, SamplingParams(max_tokens=4, temperature=0))
            assert completion.completion_tokens > 0
            await _until(lambda: spares.pid is not None)
            nxt = spares.pid
            assert nxt is not None and nxt != spare
        finally:
            await runtime.unload()
    finally:
        await asyncio.to_thread(spares.close)
    assert not _is_alive(nxt)
    spares.refill()  # closed: starts none
    await asyncio.sleep(0.5)
    assert spares.pid is None


async def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_the_engine_process_exits_when_the_server_end_closes(model_dir: Path) -> None:
    config = model_config.read_config_file(model_dir)
    assert config is not None
    parameters = read_parameters(config, OPTIONS)
    ours, theirs = socket.socketpair()
    command = [sys.executable, "-m", "runtimes.llm.engine_process", "--fd", str(theirs.fileno())]
    process = subprocess.Popen(command, pass_fds=(theirs.fileno(),))
    theirs.close()
    conn = Connection(ours.detach())
    try:
        conn.send(LoadModel(str(model_dir / "1"), "cpu", parameters, frozenset()))
        assert conn.poll(WAIT_S), "no answer to the load"
        assert isinstance(conn.recv(), Ready)
        conn.close()  # the server is gone
        assert process.wait(timeout=WAIT_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
