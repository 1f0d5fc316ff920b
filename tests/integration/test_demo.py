"""The README's first command: ``zeroserve serve --demo`` serves a model that answers."""

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


def test_demo_serves_the_curl_line_it_prints(tmp_path: Path):
    port = free_port()
    log_path = tmp_path / "demo.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "zeroserve.cli", "serve", "--demo", "--http-port", str(port)],
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
                if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError(f"demo server never got ready:\n{log_path.read_text()}")
        printed = log_path.read_text()
        match = re.search(r"curl -s -X POST (\S+) -d '(.+)'", printed)
        assert match, printed
        response = httpx.post(match.group(1), content=match.group(2), timeout=30)
        assert response.status_code == 200, response.text
        output = response.json()["outputs"][0]
        assert output["name"] == "OUTPUT0" and output["shape"] == [1, 3]
        assert (tmp_path / "demo-models" / "demo_mlp" / "1" / "model.onnx").is_file()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
