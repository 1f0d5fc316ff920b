"""Explicit model control in a real server process: SIGTERM answers the requests in flight,
then the process exits. The rest of model control is tested in process in
``tests/data_plane/test_explicit_mode.py``."""

from __future__ import annotations

import concurrent.futures
import signal
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.models import write_python_model

pytestmark = pytest.mark.integration

SLOW_MODEL = textwrap.dedent(
    """
    import time

    import numpy as np


    class TritonPythonModel:
        def initialize(self, args):
            self.delay_s = 1.5

        def execute(self, inputs):
            time.sleep(self.delay_s)
            return {"OUTPUT0": np.asarray(inputs["INPUT0"]) * 2}
    """
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    write_python_model(root, "slow", source=SLOW_MODEL)
    return root


def test_sigterm_answers_in_flight_requests_then_exits(server_factory, repo: Path):
    server = server_factory(repo, "--model-control-mode", "explicit", "--load-model", "slow")
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [3, 4]}]}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pending = pool.submit(
            httpx.post, f"{server.url}/v2/models/slow/infer", json=body, timeout=60
        )
        _wait_for_execution(server.url, "slow")
        server.process.send_signal(signal.SIGTERM)
        response = pending.result(timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [6, 8]
    # uvicorn re-raises the signal once its graceful shutdown is over.
    assert server.process.wait(timeout=60) in (0, -signal.SIGTERM)
    assert "unloaded slow" in server.log()


def _wait_for_execution(url: str, model: str) -> None:
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = httpx.get(f"{url}/metrics", timeout=30).text
        if f'zeroserve_executing_requests{{model="{model}",version="1"}} 1' in text:
            return
        time.sleep(0.05)
    raise AssertionError("the request never started executing")
