"""The README's first command (``zeroserve up --demo``) and ``zeroserve serve --demo``: each
prints a curl line, and that line gets an answer."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import free_port

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("command", ["up", "serve"])
def test_demo_answers_the_curl_line_it_prints(tmp_path: Path, command: str):
    port = free_port()
    log_path = tmp_path / "demo.log"
    if command == "up":
        args = [
            "up",
            "--demo",
            "--port",
            str(port),
            "--admin-port",
            str(free_port()),
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
        ready_path = "/v2/health/live"
    else:
        args = ["serve", "--demo", "--http-port", str(port)]
        ready_path = "/v2/health/ready"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "zeroserve.cli", *args],
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert process.poll() is None, log_path.read_text()
            try:
                ready = httpx.get(f"{url}{ready_path}", timeout=2).status_code == 200
                if ready and "curl -s" in log_path.read_text():
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError(f"demo server never got ready:\n{log_path.read_text()}")
        printed = log_path.read_text()
        match = re.search(r"curl -s -X POST (\S+) -d '(.+)'", printed)
        assert match, printed
        # Through `up` the model is scaled to zero: this request is its cold start.
        response = httpx.post(match.group(1), content=match.group(2), timeout=120)
        assert response.status_code == 200, response.text
        output = response.json()["outputs"][0]
        assert output["name"] == "OUTPUT0" and output["shape"] == [1, 3]
        if command == "serve":
            assert (tmp_path / "demo-models" / "demo_mlp" / "1" / "model.onnx").is_file()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
