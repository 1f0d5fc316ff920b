"""The README's first command (``zeroserve up --demo``) and ``zeroserve serve --demo``: each
prints a curl line, and that line gets an answer."""

from __future__ import annotations

import json
import os
import re
import shutil
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
        match = re.search(r"curl -s -X POST (\S+)(?: -H \"([^\"]+)\")? -d '(.+)'", printed)
        assert match, printed
        url, header, body = match.groups()
        if command == "up":
            # Keys are on by default: the line carries the demo key, and only it gets in.
            assert header is not None and header.startswith("Authorization: Bearer zs_")
            assert httpx.post(url, content=body, timeout=60).status_code == 401
        headers = dict([header.split(": ", 1)]) if header else {}
        if shutil.which("curl"):
            # The line as printed, through a shell, as a reader pastes it.
            line = re.search(r"curl -s .*", printed)
            assert line is not None
            done = subprocess.run(
                ["bash", "-c", line.group(0)], capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stderr
            answer = json.loads(done.stdout)
        else:
            # Through `up` the model is scaled to zero: this request is its cold start.
            response = httpx.post(url, content=body, headers=headers, timeout=120)
            assert response.status_code == 200, response.text
            answer = response.json()
        output = answer["outputs"][0]
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
