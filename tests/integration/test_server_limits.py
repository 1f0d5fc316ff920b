"""Every zeroserve server bounds its clients' connections (`foundation.http.ServerLimits`):
oversized heads get 431, slow heads 408, stalled bodies and idle connections are closed, and
connections past the cap make room or get 503. Real processes on free loopback ports, driven
through raw sockets; the limits are shortened through each server's environment.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import free_port

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
WAIT_S = 30.0
"""Generous bound on anything the server should do by itself (close, answer)."""
TOKEN = "limits-test-token"


@dataclass
class Server:
    kind: str
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=WAIT_S)
        sock.settimeout(WAIT_S)
        return sock

    @property
    def probe_path(self) -> str:
        return "/healthz" if self.kind == "admin" else "/v2/health/live"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)


PREFIXES = {
    "data_plane": "ZEROSERVE_DATA_PLANE_",
    "activator": "ZEROSERVE_ACTIVATOR_",
    "admin": "ZEROSERVE_CONTROL_PLANE_",
    "up": "ZEROSERVE_ACTIVATOR_",  # its public server: the activator in process
}


def _command(kind: str, port: int, tmp_path: Path) -> list[str]:
    if kind == "data_plane":
        repository = tmp_path / "repository"
        repository.mkdir(exist_ok=True)
        return ["-m", "data_plane", "--model-repository", str(repository), "--http-port", str(port)]
    if kind == "activator":
        return ["-m", "zeroserve.cli", "activator", "--host", "127.0.0.1", "--port", str(port)]
    if kind == "up":
        return [
            "-m",
            "zeroserve.cli",
            "up",
            "--port",
            str(port),
            "--admin-port",
            str(free_port()),
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
    return [
        "-m",
        "zeroserve.cli",
        "control-plane",
        "--admin-port",
        str(port),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--worker-log-dir",
        str(tmp_path / "workers"),
    ]


StartServer = Callable[..., Server]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Call it with a server kind and its limits (``header_timeout_s=1``...); all stop at
    teardown."""
    started: list[Server] = []

    def start(kind: str, **limits: object) -> Server:
        port = free_port()
        log_path = tmp_path / f"{kind}-{port}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROSERVE_")}
        env |= {
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "ZEROSERVE_CACHE_DIR": str(tmp_path / "cache"),
            "ZEROSERVE_ADMIN_TOKEN": TOKEN,
            # Triton's default gRPC port (8001) may be taken on a shared machine.
            "ZEROSERVE_DATA_PLANE_GRPC_PORT": "0",
            # Limits of the connection, not of keys (tests/integration/test_keys_e2e.py).
            "ZEROSERVE_ACTIVATOR_AUTH": "off",
        }
        env |= {PREFIXES[kind] + name.upper(): str(value) for name, value in limits.items()}
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, *_command(kind, port, tmp_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        server = Server(kind, process, port, log_path)
        started.append(server)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{kind} exited: {log_path.read_text(errors='replace')}")
            try:
                url = f"http://127.0.0.1:{port}{server.probe_path}"
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return server
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{kind} did not start: {log_path.read_text(errors='replace')}")

    try:
        yield start
    finally:
        for server in started:
            server.stop()


def request(path: str, *headers: bytes, close: bool = False) -> bytes:
    lines = [b"GET " + path.encode() + b" HTTP/1.1", b"Host: test", *headers]
    if close:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def read_answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (or resets) the connection."""
    received = b""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        received += chunk
    else:
        raise AssertionError(f"the connection was not closed within {WAIT_S} s: {received!r}")
    return received


def read_response(sock: socket.socket) -> bytes:
    """One response that carries Content-Length, leaving the connection open."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed inside an answer: {received!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def send_and_read(server: Server, payload: bytes) -> bytes:
    with server.connect() as sock:
        try:
            sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the client finished: the answer is still to be read
        return read_answer(sock)


def status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1])


SERVERS = ["data_plane", "activator", "admin", "up"]


@pytest.mark.parametrize("kind", SERVERS)
def test_oversized_heads_are_answered_431_and_normal_ones_served(
    kind: str, start_server: StartServer
) -> None:
    server = start_server(kind)
    path = server.probe_path
    many = [b"X-Header-%d: v" % i for i in range(10_000)]
    answer = send_and_read(server, request(path, *many))
    assert status(answer) == 431, answer[:300]
    assert b"header fields" in answer
    # One header of 1 MiB, ended; and one of 2 MiB never ended (the header in progress is
    # measured from the bytes, before httptools shows it).
    big = b"X-Big: " + b"a" * 2**20
    assert status(send_and_read(server, request(path, big))) == 431
    unended = request(path)[:-2] + b"X-Big: " + b"a" * 2 * 2**20
    assert status(send_and_read(server, unended)) == 431
    assert status(send_and_read(server, request("/" + "a" * 2**20))) == 431
    # A generous but normal head is served, several times on one connection.
    normal = [b"X-Header-%d: %s" % (i, b"v" * 200) for i in range(60)]
    with server.connect() as sock:
        for _ in range(3):
            sock.sendall(request(path, *normal))
            assert status(read_response(sock)) == 200


@pytest.mark.parametrize("kind", SERVERS)
def test_slow_heads_and_idle_connections_are_closed(kind: str, start_server: StartServer) -> None:
    server = start_server(kind, header_timeout_s=1, keep_alive_timeout_s=1)
    # Slowloris: a head sent a byte at a time is answered 408 and closed.
    with server.connect() as sock:
        for byte in request(server.probe_path)[:20]:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.1)
        answer = read_answer(sock)
    assert status(answer) == 408, answer
    # A connection that never sends is closed without an answer.
    with server.connect() as sock:
        assert read_answer(sock) == b""
    # Idle after an answer: closed by the keep-alive timeout.
    with server.connect() as sock:
        sock.sendall(request(server.probe_path))
        assert status(read_response(sock)) == 200
        assert read_answer(sock) == b""


@pytest.mark.parametrize("kind", ["activator", "up"])
def test_the_public_server_keeps_idle_connections_as_long_as_the_load_balancer(
    kind: str, start_server: StartServer
) -> None:
    """Behind an ALB (idle timeout 1800 s) the target must close idle connections last; the
    public server used to close them after uvicorn's 5 s, racing clients that reuse them."""
    server = start_server(kind)
    with server.connect() as sock:
        sock.sendall(request(server.probe_path))
        assert status(read_response(sock)) == 200
        time.sleep(6.5)
        sock.sendall(request(server.probe_path))
        assert status(read_response(sock)) == 200


def test_a_stalled_request_body_is_cut(start_server: StartServer) -> None:
    server = start_server("data_plane", body_timeout_s=1)
    with server.connect() as sock:
        sock.sendall(
            b"POST /v2/repository/index HTTP/1.1\r\nHost: test\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        # The application owns the answer once it reads the body; it sees a disconnect.
        assert read_answer(sock) == b""


def test_connections_past_the_cap_close_the_idlest_or_get_503(start_server: StartServer) -> None:
    server = start_server("data_plane", max_connections=4)
    path = server.probe_path
    silent = [server.connect() for _ in range(4)]
    try:
        # Full of idle connections: a new one is served and the oldest idle one is closed.
        extra = server.connect()
        silent.append(extra)
        extra.sendall(request(path))
        assert status(read_response(extra)) == 200
        assert read_answer(silent[0]) == b""
        # Now every connection is busy: a head under way, sent with a request whose answer
        # shows that the server has read it too.
        for sock in silent[1:]:
            sock.sendall(request(path) + b"GET " + path.encode())
            assert status(read_response(sock)) == 200
        with server.connect() as refused:
            refused.sendall(request(path))
            answer = read_answer(refused)
        assert status(answer) == 503, answer
        assert b"retry-after: 1" in answer.lower()
        # Room again once one closes.
        silent.pop().close()
        deadline = time.monotonic() + WAIT_S
        while True:
            answer = send_and_read(server, request(path, close=True))
            if status(answer) == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status(answer) == 200, answer
    finally:
        for sock in silent:
            sock.close()
