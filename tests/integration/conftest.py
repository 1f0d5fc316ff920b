"""Start real ``zeroserve serve`` processes on free loopback ports, and always stop them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from bench.server import free_port as free_port  # re-exported: the tests take it from here

START_TIMEOUT_S = 90.0


@dataclass
class ServerProcess:
    """A running server: its URL, its process and where its log goes."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        """host:port, the form tritonclient takes."""
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)
        return self.process.returncode


def start_server(repository: Path, log_dir: Path, *args: str) -> ServerProcess:
    """Start ``python -m data_plane`` and wait until it answers live and ready probes."""
    port = free_port()
    log_path = log_dir / f"server-{port}.log"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "ZEROSERVE_CACHE_DIR": str(log_dir / "cache"),
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "data_plane",
                "--model-repository",
                str(repository),
                "--http-port",
                str(port),
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    server = ServerProcess(process, port, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.url}/v2/health/live", timeout=2.0).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"server did not start within {START_TIMEOUT_S} s:\n{server.log()}")


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[object]:
    """Call it with (repository, *args) to start a server; all are stopped at teardown."""
    started: list[ServerProcess] = []

    def factory(repository: Path, *args: str) -> ServerProcess:
        server = start_server(repository, tmp_path, *args)
        started.append(server)
        return server

    try:
        yield factory
    finally:
        for server in started:
            server.stop()
