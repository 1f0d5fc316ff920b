"""Real S3-compatible servers for storage tests: moto_server, and a fault-injecting proxy.

``MotoServer`` runs ``python -m moto.server`` on a free loopback port with its request log
in a file: werkzeug writes a request's line when it sends the status line, so once a client
has a response, its request is in the log, and tests count object GETs there.

``FaultProxy`` forwards to a server and, for object GETs only (no query string: not
listings), can flip a byte of the body (``corrupt``), cut the body short (``truncate``),
or hold the request without answering (``hang``); ``faults`` bounds how many requests it
spoils (None: all).
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import boto3

START_TIMEOUT_S = 30.0
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
REGION = "us-east-1"

FaultMode = Literal["pass", "corrupt", "truncate", "hang"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def s3_client(endpoint_url: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint_url, region_name=REGION, **CREDENTIALS)


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


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


@dataclass
class FaultProxy:
    """An HTTP proxy in front of ``upstream`` that spoils object GETs on demand."""

    upstream_port: int
    mode: FaultMode = "pass"
    faults: int | None = None
    """How many more object GETs to spoil; None: every one."""
    hang_s: float = 5.0
    spoiled: int = 0
    _server: ThreadingHTTPServer | None = None
    _release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def set(self, mode: FaultMode, faults: int | None = None) -> None:
        with self._lock:
            self.mode, self.faults, self.spoiled = mode, faults, 0

    def start(self) -> None:
        proxy = self

        class Handler(_ForwardingHandler):
            pass

        Handler.proxy = proxy
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.block_on_close = False
        self._server = server
        threading.Thread(target=server.serve_forever, name="fault-proxy", daemon=True).start()

    def stop(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _take_fault(self) -> FaultMode:
        with self._lock:
            if self.mode == "pass" or self.faults == 0:
                return "pass"
            if self.faults is not None:
                self.faults -= 1
            self.spoiled += 1
            return self.mode


class _ForwardingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: FaultProxy

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def do_PUT(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def do_DELETE(self) -> None:
        self._forward()

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        is_object_get = self.command == "GET" and "?" not in self.path
        fault = self.proxy._take_fault() if is_object_get else "pass"
        if fault == "hang":
            self.proxy._release.wait(self.proxy.hang_s)
            self.close_connection = True
            return
        upstream = http.client.HTTPConnection("127.0.0.1", self.proxy.upstream_port, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            reply_headers = response.getheaders()
        finally:
            upstream.close()
        if fault == "corrupt" and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        self.send_response(response.status, response.reason)
        for name, value in reply_headers:
            if name.lower() in {"connection", "transfer-encoding", "keep-alive"}:
                continue
            if name.lower() == "content-length" and self.command != "HEAD":
                continue
            self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if fault == "truncate":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(data)
