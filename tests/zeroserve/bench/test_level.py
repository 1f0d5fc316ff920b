"""One level at a time, as the scripts under ``bench/`` drive ``zeroserve bench``: each call
runs its own event loop against a keep-alive server in a thread. Only counts are asserted,
never times."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from zeroserve.bench import Body, Endpoint, LoadPlan, http_request, run_closed, run_open

ANSWER = b'{"outputs":[]}'


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="level-server", daemon=True)
    thread.start()
    try:
        yield Endpoint("127.0.0.1", server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _plan(endpoint: Endpoint, duration_s: float) -> LoadPlan:
    body = Body(b'{"inputs":[]}', (("Content-Type", "application/json"),))
    request = http_request(endpoint.host_header, "POST", "/v2/models/m/infer", body)
    return LoadPlan(
        endpoint,
        (request,),
        warmup_s=0.1,
        duration_s=duration_s,
        timeout_s=10.0,
        connect_timeout_s=5.0,
    )


def test_a_closed_level_answers_and_counts_its_client_cpu(endpoint: Endpoint) -> None:
    result = run_closed(_plan(endpoint, 0.3), 2)
    assert (result.mode, result.level) == ("concurrency", 2.0)
    assert result.ok > 0 and result.errors == {}
    assert result.latency.count == result.ok
    assert result.connections == 2
    assert result.client_cpu_cores > 0


def test_an_open_level_answers_its_schedule(endpoint: Endpoint) -> None:
    result = run_open(_plan(endpoint, 0.5), 100.0, seed=3, max_connections=8)
    assert (result.mode, result.level) == ("rate", 100.0)
    assert result.ok > 0 and result.errors == {}
    assert result.offered_rate is not None and result.offered_rate > 0
    assert 1 <= result.connections <= 8


def test_nobody_listening_is_counted_as_connect_errors() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run_closed(_plan(Endpoint("127.0.0.1", port), 0.2), 1)
    assert result.ok == 0
    assert result.errors.get("connect", 0) > 0


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda plan: run_closed(plan, 0), id="no-connections"),
        pytest.param(lambda plan: run_open(plan, 10.0, max_connections=0), id="open-no-room"),
    ],
)
def test_a_level_without_room_is_refused(endpoint: Endpoint, call) -> None:
    with pytest.raises(ValueError):
        call(_plan(endpoint, 0.1))
