"""A real ``zeroserve serve`` (the command a user runs) on free loopback HTTP and gRPC
ports, for the ``zeroserve bench`` tests; stopped on exit whatever happens."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx

from tests.triton_oracle import free_ports

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Served:
    """Where the server listens."""

    http_port: int
    grpc_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@contextlib.contextmanager
def zeroserve_serve(repository: Path, workdir: Path) -> Iterator[Served]:
    """Serve ``repository`` until the block ends; waits for HTTP readiness and a gRPC
    channel that connects, raising with the server's log if either never comes."""
    http_port, grpc_port = free_ports(2)
    env = {**os.environ, "ZEROSERVE_CACHE_DIR": str(workdir / "cache"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "zeroserve.cli", "serve", "--model-repository"]
    command += [str(repository), "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    command += ["--log-level", "warning"]
    log_path = workdir / f"serve-{http_port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    served = Served(http_port, grpc_port)
    try:
        _wait_ready(process, served, log_path)
        yield served
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)


def _wait_ready(process: subprocess.Popen[bytes], served: Served, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"zeroserve serve exited:\n{log_path.read_text()}")
        try:
            if httpx.get(f"{served.url}/v2/health/ready", timeout=2.0).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"zeroserve serve not ready:\n{log_path.read_text()}")
        time.sleep(0.2)
    with grpc.insecure_channel(served.grpc_address) as channel:
        remaining = max(deadline - time.monotonic(), 1.0)
        try:
            grpc.channel_ready_future(channel).result(timeout=remaining)
        except grpc.FutureTimeoutError:
            raise RuntimeError(f"no gRPC listener:\n{log_path.read_text()}") from None
