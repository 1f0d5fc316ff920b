"""A real redis-server on a free loopback port, and every state store behind one fixture.

The ``make_store`` fixture is parametrized over the in-memory, the SQLite and the Redis
store, so every test that takes it is one contract test run against each implementation.
redis-server must be installed (``apt-get install -y redis-server``): without it the Redis
cases fail, loudly, instead of being skipped.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Protocol

import pytest

from bench.server import free_port
from control_plane.store.base import StateStore
from control_plane.store.memory import MemoryStateStore
from control_plane.store.sqlite import SqliteStateStore

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


def answers_ping(port: int) -> bool:
    """Whether a Redis on ``port`` answers PING now (raw RESP, so no client library needed)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server child process on a fixed loopback port.

    Tests may stop and start it again on the same port (a restart loses every key, as a
    restart without persistence does, unless ``persistent``: then an append-only file in
    ``log_dir`` brings them back), or freeze it with SIGSTOP to see a server that accepts
    connections and never answers. ``stop`` always ends the process.
    """

    def __init__(
        self, executable: str, port: int, log_dir: Path, *, persistent: bool = False
    ) -> None:
        self.executable = executable
        self.port = port
        self.log_path = log_dir / f"redis-{port}.log"
        self._log_dir = log_dir
        self._persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if persistent
            else ["--appendonly", "no"]
        )
        self._process: subprocess.Popen[bytes] | None = None
        self._frozen = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> None:
        """Start the server and wait until it answers PING; raise with its log if it won't."""
        assert self._process is None, "already running"
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    self.executable,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    *self._persistence,
                    "--dir",
                    str(self._log_dir),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answers_ping(self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start:\n{self.log()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """End the process (thawing it first if frozen) and wait for it; idempotent."""
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if process.poll() is None:
                self.thaw_process(process)
                process.terminate()
                try:
                    process.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=STOP_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)

    def restart(self) -> None:
        self.stop()
        self.start()

    def freeze(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel, nothing is answered."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)
        self._frozen = True

    def thaw(self) -> None:
        if self._process is not None:
            self.thaw_process(self._process)

    def thaw_process(self, process: subprocess.Popen[bytes]) -> None:
        if self._frozen:
            process.send_signal(signal.SIGCONT)
            self._frozen = False


def start_redis_server(log_dir: Path, *, persistent: bool = False) -> RedisServer:
    """A started RedisServer on a free port; fails the test if redis-server is missing."""
    executable = shutil.which("redis-server")
    if executable is None:
        pytest.fail(
            "redis-server is not installed (PATH has none): the Redis state store is tested "
            "against the real server. Install it: apt-get update && apt-get install -y "
            "redis-server",
            pytrace=False,
        )
    # The port is free when chosen but may be taken before redis binds it; try a few.
    for attempt in range(3):
        server = RedisServer(executable, free_port(), log_dir, persistent=persistent)
        try:
            server.start()
        except RuntimeError:
            if attempt == 2:
                raise
        else:
            return server
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One server for the whole session; tests keep apart by key prefix. Never restarted."""
    server = start_redis_server(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server for one test alone, which it may stop, restart or freeze."""
    server = start_redis_server(tmp_path)
    try:
        yield server
    finally:
        server.stop()


class MakeStore(Protocol):
    """Opens another store of the implementation under test (closed after the test).

    Redis stores opened in one test share a key prefix, so they are replicas of one state;
    memory and SQLite stores (each on a file of its own) are independent.
    """

    def __call__(
        self, *, traffic_ttl_s: float = 30.0, activation_pending_ttl_s: float = 30.0
    ) -> StateStore: ...


@pytest.fixture(
    params=[
        pytest.param("memory"),
        pytest.param("sqlite"),
        pytest.param("redis", marks=pytest.mark.integration),
    ]
)
def backend(request: pytest.FixtureRequest) -> str:
    """``memory``, ``sqlite``, or the URL of the session's redis-server."""
    if request.param in ("memory", "sqlite"):
        return str(request.param)
    # Started on first use, so `-m "not integration"` runs without redis-server.
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@pytest.fixture
async def make_store(backend: str, tmp_path: Path) -> AsyncIterator[MakeStore]:
    stores: list[StateStore] = []
    prefix = f"test-{uuid.uuid4().hex[:12]}:"

    def make(*, traffic_ttl_s: float = 30.0, activation_pending_ttl_s: float = 30.0) -> StateStore:
        store: StateStore
        if backend == "memory":
            store = MemoryStateStore(
                traffic_ttl_s=traffic_ttl_s, activation_pending_ttl_s=activation_pending_ttl_s
            )
        elif backend == "sqlite":
            store = SqliteStateStore(
                tmp_path / f"state-{len(stores)}.db",
                traffic_ttl_s=traffic_ttl_s,
                activation_pending_ttl_s=activation_pending_ttl_s,
            )
        else:
            from control_plane.store.redis import RedisStateStore

            store = RedisStateStore(
                backend,
                key_prefix=prefix,
                # Generous: a slow CI machine must not turn into a spurious outage.
                timeout_s=10.0,
                traffic_ttl_s=traffic_ttl_s,
                activation_pending_ttl_s=activation_pending_ttl_s,
            )
        stores.append(store)
        return store

    try:
        yield make
    finally:
        for store in stores:
            await store.close()


@pytest.fixture
async def store(make_store: MakeStore) -> StateStore:
    """One store of the implementation under test."""
    return make_store()
