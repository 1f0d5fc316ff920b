"""``zeroserve serve`` as a subprocess, driven with plain HTTP (httpx): what needs the
process (its command line reaching the server). The HTTP API itself is tested in process in
``tests/data_plane/test_serve_http.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import ServerProcess
from tests.models import write_onnx_mlp

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_onnx_mlp(root, "mlp", sizes=(16, 32, 8), max_batch_size=32)
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory):
    from tests.integration.conftest import start_server

    process = start_server(
        repo, tmp_path_factory.mktemp("logs"), "--http-max-input-size", "1000000"
    )
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def client(server: ServerProcess):
    with httpx.Client(base_url=server.url, timeout=60.0) as c:
        yield c


def test_body_over_the_size_limit_is_refused(client: httpx.Client):
    response = client.post("/v2/models/mlp/infer", content=b"x" * 1_000_001)
    assert response.status_code == 400
    assert "exceeds the maximum allowed value of 1000000 bytes" in response.json()["error"]
    assert client.get("/v2/health/live").status_code == 200


def test_load_model_without_explicit_mode_is_a_start_error(repo: Path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "data_plane",
            "--model-repository",
            str(repo),
            "--load-model",
            "mlp",
        ],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert b"--model-control-mode explicit" in result.stderr
