"""The poller over a real repository and its folder, one round at a time (rounds are run
by the test, the clock is the test's): models added, changed, broken and removed while
serving, a request on a replaced version finishing on it, and what the scan sees."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from data_plane.errors import NotFoundError
from data_plane.poll import RepositoryPoller, scan_models
from data_plane.protocol import InferInput, InferRequest
from data_plane.repository import IndexEntry, VersionState
from data_plane.settings import ModelControlMode
from tests.data_plane.server_app import Core, data_plane_core
from tests.fakes import FakeClock
from tests.models import write_python_model

pytestmark = pytest.mark.anyio

TAGGED = """\
import os
import time

import numpy as np

TAG = {tag!r}


class TritonPythonModel:
    def initialize(self, args):
        self.gate = os.path.join(args["model_repository"], "gate")

    def execute(self, inputs):
        x = inputs["INPUT0"]
        if x.flatten()[0] < 0:
            # A slow request: it waits for the test to open the gate (bounded).
            deadline = time.monotonic() + 30
            while os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.01)
        return {{"OUTPUT0": np.full(x.shape, TAG, dtype=np.float32)}}
"""
"""Answers its tag; a request with a negative first value waits while a ``gate`` file
exists in the model's folder."""


def write_tagged(repo: Path, name: str, tag: float, *, version: int = 1) -> Path:
    return write_python_model(
        repo, name, TAGGED.format(tag=tag), dims=(1,), max_batch_size=0, version=version
    )


@pytest.fixture
async def polled(tmp_path: Path) -> AsyncIterator[tuple[Core, RepositoryPoller, Path]]:
    repo = tmp_path / "repo"
    write_tagged(repo, "a", 1.0)
    async with data_plane_core(repo, tmp_path / "cache", mode=ModelControlMode.POLL) as core:
        poller = RepositoryPoller(core.repository, repo, interval_s=1.0, clock=FakeClock())
        await poller.poll_once()
        yield core, poller, repo


async def answer(core: Core, name: str, value: float = 1.0, version: int | None = None):
    model = core.repository.get(name, version)
    request = InferRequest(
        id=None,
        inputs=[InferInput("INPUT0", "FP32", (1,), np.array([value], dtype=np.float32))],
        outputs=None,
        parameters={},
        binary_data_output=False,
        priority=0,
        timeout_us=0,
    )
    response = await core.handlers.infer.infer(model, request)
    [output] = response.outputs
    return int(response.model_version), float(output.data[0])


def touch_later(path: Path) -> None:
    """Give ``path`` a later modification time, as an edit a moment later would."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


async def test_the_first_round_loads_what_the_repository_holds(polled):
    core, _poller, _repo = polled
    assert await answer(core, "a") == (1, 1.0)
    assert core.handlers.server.ready()


async def test_a_new_model_is_loaded(polled):
    core, poller, repo = polled
    write_tagged(repo, "b", 2.0)
    with pytest.raises(NotFoundError):
        core.repository.get("b")
    await poller.poll_once()
    assert await answer(core, "b") == (1, 2.0)


async def test_a_changed_model_is_reloaded_and_requests_taken_finish_on_the_old(polled):
    core, poller, repo = polled
    gate = repo / "a" / "gate"
    gate.touch()
    old = core.repository.get("a")
    slow = asyncio.create_task(answer(core, "a", value=-1.0))
    model_py = repo / "a" / "1" / "model.py"
    model_py.write_text(TAGGED.format(tag=3.0))
    touch_later(model_py)
    reload = asyncio.create_task(poller.poll_once())
    # The reload swaps the versions without waiting for the slow request. (Asking the old
    # version meanwhile would queue behind the slow request on its one instance.)
    async with asyncio.timeout(30):
        while True:
            if core.repository.get("a") is not old:
                break
            await asyncio.sleep(0.01)
    # The new version serves; the old one drains the request it holds.
    assert await answer(core, "a") == (1, 3.0)
    assert not slow.done()
    gate.unlink()
    async with asyncio.timeout(30):
        assert await slow == (1, 1.0)
        await reload


async def test_a_new_version_replaces_the_old_one(polled):
    core, poller, repo = polled
    write_tagged(repo, "a", 5.0, version=2)
    await poller.poll_once()
    assert await answer(core, "a") == (2, 5.0)
    index = await core.handlers.repository.index()
    assert IndexEntry("a", 1, VersionState.UNAVAILABLE, "unloaded") in index
    assert IndexEntry("a", 2, VersionState.READY, "") in index


async def test_a_broken_config_leaves_the_old_version_serving(polled):
    core, poller, repo = polled
    config = repo / "a" / "config.pbtxt"
    good = config.read_text()
    config.write_text(good + "\nnot a field: 1\n")
    touch_later(config)
    await poller.poll_once()
    assert await answer(core, "a") == (1, 1.0)
    assert core.handlers.server.ready()
    [tracked] = poller.state.models.values()
    assert tracked.failures == 1
    # Fixed, it is picked up at the next round.
    config.write_text(good.replace("max_batch_size: 0", "max_batch_size: 0\n"))
    touch_later(config)
    await poller.poll_once()
    assert poller.state.models["a"].failures == 0
    assert await answer(core, "a") == (1, 1.0)


async def test_a_model_that_fails_makes_the_server_not_ready_until_it_goes(polled):
    core, poller, repo = polled
    write_python_model(repo, "broken", "this is not python(\n")
    await poller.poll_once()
    assert not core.handlers.server.ready()
    [row] = [e for e in await core.handlers.repository.index() if e.name == "broken"]
    assert row.state is VersionState.UNAVAILABLE
    # Unchanged and not due: not tried again at the next round.
    await poller.poll_once()
    assert poller.state.models["broken"].failures == 1
    for path in sorted((repo / "broken").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (repo / "broken").rmdir()
    await poller.poll_once()
    assert core.handlers.server.ready()


async def test_a_removed_model_is_unloaded_and_leaves_the_index(polled):
    core, poller, repo = polled
    write_tagged(repo, "b", 2.0)
    await poller.poll_once()
    for path in sorted((repo / "b").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (repo / "b").rmdir()
    await poller.poll_once()
    with pytest.raises(NotFoundError, match="'b' has no available versions"):
        core.repository.get("b")
    assert [e.name for e in await core.handlers.repository.index()] == ["a"]


async def test_model_control_is_refused_in_poll_mode(polled):
    core, _poller, _repo = polled
    with pytest.raises(Exception, match="not allowed if polling is enabled"):
        await core.handlers.repository.load("a")


def test_a_scan_sees_edits_and_skips_what_is_not_a_model(tmp_path: Path):
    write_tagged(tmp_path, "a", 1.0)
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "notes.txt").write_text("not a model")
    first = scan_models(tmp_path)
    assert list(first) == ["a"] and first["a"] is not None
    assert scan_models(tmp_path) == first
    touch_later(tmp_path / "a" / "1" / "model.py")
    assert scan_models(tmp_path)["a"] != first["a"]
    (tmp_path / "a" / "2").mkdir()
    (tmp_path / "a" / "2" / "model.py").write_text("")
    assert len({scan_models(tmp_path)["a"], first["a"]}) == 2
