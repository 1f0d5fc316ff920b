"""Real S3-compatible servers for storage tests: moto_server, and a fault-injecting proxy.

``MotoServer`` and ``start_moto`` are ``bench.moto_server``'s (the benchmarks start the same
server): ``python -m moto.server`` on a free loopback port with its request log in a file,
where tests count object GETs.

``FaultProxy`` forwards to a server and, for object GETs only (no query string: not
listings), can flip a byte of the body (``corrupt``), cut the body short (``truncate``),
or hold the request without answering (``hang``); ``faults`` bounds how many requests it
spoils (None: all).
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from bench.moto_server import (
    CREDENTIALS as CREDENTIALS,
    REGION as REGION,
    MotoServer as MotoServer,
    start_moto as start_moto,
)

FaultMode = Literal["pass", "corrupt", "truncate", "hang"]


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
