"""``zeroserve serve --model-control-mode poll``: a real server following its repository
folder while it serves (models added, changed, broken and removed), named by ``--id``."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import ServerProcess
from tests.models import write_python_model

pytestmark = pytest.mark.integration

WAIT_S = 60.0
TAGGED = """\
import numpy as np


class TritonPythonModel:
    def execute(self, inputs):
        return {{"OUTPUT0": np.full(inputs["INPUT0"].shape, {tag}, dtype=np.float32)}}
"""


def write_tagged(repo: Path, name: str, tag: float) -> Path:
    return write_python_model(repo, name, TAGGED.format(tag=tag), dims=(1,), max_batch_size=0)


def tag_of(server: ServerProcess, name: str) -> float | None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [0]}]}
    response = httpx.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=30)
    if response.status_code != 200:
        return None
    return float(response.json()["outputs"][0]["data"][0])


def wait_for(what: str, check: Callable[[], bool], server: ServerProcess) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {WAIT_S} s:\n{server.log()}")


def edit(path: Path, text: str) -> None:
    path.write_text(text)
    # A later modification time than the last scan's, whatever the file system's clock step.
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def test_a_polling_server_follows_its_repository(server_factory, tmp_path: Path):
    repo = tmp_path / "repo"
    write_tagged(repo, "a", 1.0)
    server: ServerProcess = server_factory(
        repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.2", "--id", "edge-7"
    )
    url = server.url
    wait_for("start-up", lambda: httpx.get(f"{url}/v2/health/ready").status_code == 200, server)
    assert httpx.get(f"{url}/v2").json()["name"] == "edge-7"
    assert tag_of(server, "a") == 1.0

    write_tagged(repo, "b", 2.0)
    wait_for("b loaded", lambda: tag_of(server, "b") == 2.0, server)

    edit(repo / "a" / "1" / "model.py", TAGGED.format(tag=3.0))
    wait_for("a reloaded", lambda: tag_of(server, "a") == 3.0, server)

    config = repo / "a" / "config.pbtxt"
    edit(config, config.read_text() + "\nnot_a_field: 1\n")
    wait_for("a's broken config seen", lambda: "poll: load of a failed" in server.log(), server)
    assert tag_of(server, "a") == 3.0
    assert httpx.get(f"{url}/v2/health/ready").status_code == 200

    shutil.rmtree(repo / "b")
    wait_for("b unloaded", lambda: tag_of(server, "b") is None, server)
    index = httpx.post(f"{url}/v2/repository/index").json()
    assert [row["name"] for row in index] == ["a"]

    refused = httpx.post(f"{url}/v2/repository/models/a/load")
    assert refused.status_code == 503
    assert refused.json() == {
        "error": "explicit model load / unload is not allowed if polling is enabled"
    }
    assert server.stop() == 0
