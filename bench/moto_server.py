"""A real S3-compatible server on loopback: ``python -m moto.server`` (moto is a dev
dependency), for the benchmarks and the tests that need s3:// storage.

:func:`start_moto` runs it on a free port with its request log in a file: werkzeug writes a
request's line when it sends the status line, so once a client has a response, its request
is in the log, and :meth:`MotoServer.object_gets` counts object GETs there.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import boto3

from bench.server import free_port

START_TIMEOUT_S: Final = 30.0
CREDENTIALS: Final = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
"""moto accepts any; these are what clients of the server sign with."""
REGION: Final = "us-east-1"

_ANSI_ESCAPE: Final = re.compile(r"\x1b\[[0-9;]*m")


def s3_client(endpoint_url: str) -> Any:
    """A boto3 S3 client for the server at ``endpoint_url``."""
    return boto3.client("s3", endpoint_url=endpoint_url, region_name=REGION, **CREDENTIALS)


@dataclass
class MotoServer:
    """A running moto_server; stop() always ends it."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> Any:
        return s3_client(self.url)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def object_gets(self, bucket: str, key_prefix: str = "") -> int:
        """GET requests for objects (not listings) in ``bucket`` under ``key_prefix``."""
        pattern = re.compile(rf'"GET /{re.escape(bucket)}/{re.escape(key_prefix)}[^ ?]* HTTP')
        # Werkzeug colours some status lines (206 among them) with ANSI escapes, even in a file.
        return len(pattern.findall(_ANSI_ESCAPE.sub("", self.log())))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_moto(log_dir: Path, *, env: dict[str, str] | None = None) -> MotoServer:
    """Start moto_server on a free loopback port, its log in ``log_dir``; raises
    ``RuntimeError`` (with the log) when it exits or does not listen within
    :data:`START_TIMEOUT_S`."""
    port = free_port()
    log_path = log_dir / f"moto-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    server = MotoServer(process, port, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {process.returncode}:\n{server.log()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"moto_server did not start within {START_TIMEOUT_S} s:\n{server.log()}")
