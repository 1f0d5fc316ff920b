"""Both loops against small misbehaving servers on loopback: answers and errors by kind.

The servers run on the test's own event loop; each level lasts a fraction of a second and
only counts are asserted, never times.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from zeroserve.bench.client import Endpoint, EndpointError
from zeroserve.bench.closed_loop import ClosedLoop, LoadPlan
from zeroserve.bench.open_loop import OpenLoop
from zeroserve.bench.payload import Body, http_request

pytestmark = pytest.mark.anyio

Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter], "asyncio.Future[None]"]


async def _read_request(reader: asyncio.StreamReader) -> bool:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return True


def _answer(status: str, body: bytes, extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


async def _ok(reader, writer):
    while await _read_request(reader):
        writer.write(_answer("200 OK", b'{"outputs":[]}'))


async def _chunked(reader, writer):
    while await _read_request(reader):
        writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )


async def _busy(reader, writer):
    while await _read_request(reader):
        writer.write(_answer("503 Service Unavailable", b'{"error":"queue full"}'))


async def _close_after_answer(reader, writer):
    if await _read_request(reader):
        writer.write(_answer("200 OK", b"{}", "connection: close\r\n"))
        await writer.drain()
    writer.close()


async def _hang(reader, writer):
    await _read_request(reader)
    await asyncio.sleep(30)


async def _drop(reader, writer):
    await _read_request(reader)
    writer.transport.abort()


async def _garbage(reader, writer):
    await _read_request(reader)
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")


@asynccontextmanager
async def _server(behaviour) -> AsyncIterator[Endpoint]:
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader, writer):
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await behaviour(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            tasks.discard(task)
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Endpoint("127.0.0.1", port)
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


def _plan(endpoint: Endpoint, *, timeout_s: float = 5.0, duration_s: float = 0.3) -> LoadPlan:
    body = Body(b'{"inputs":[]}', (("Content-Type", "application/json"),))
    request = http_request(endpoint.host_header, "POST", "/v2/models/m/infer", body)
    return LoadPlan(
        endpoint=endpoint,
        requests=(request,),
        warmup_s=0.0,
        duration_s=duration_s,
        timeout_s=timeout_s,
        connect_timeout_s=2.0,
    )


@pytest.mark.parametrize(
    "behaviour", [_ok, _chunked, _close_after_answer], ids=lambda b: b.__name__
)
async def test_closed_loop_counts_answers(behaviour):
    async with _server(behaviour) as endpoint:
        result = await ClosedLoop(_plan(endpoint), 4).run()
    assert result.ok > 0
    assert result.errors == {}
    assert result.latency.count == result.ok
    assert result.throughput == pytest.approx(result.ok / result.duration_s)


@pytest.mark.parametrize(
    ("behaviour", "kind"),
    [
        pytest.param(_busy, "http_503", id="status"),
        pytest.param(_hang, "timeout", id="timeout"),
        pytest.param(_drop, "connection", id="dropped"),
        pytest.param(_garbage, "protocol", id="not http"),
    ],
)
async def test_closed_loop_counts_errors_by_kind(behaviour, kind):
    async with _server(behaviour) as endpoint:
        result = await ClosedLoop(_plan(endpoint, timeout_s=0.1), 2).run()
    assert result.ok == 0
    assert set(result.errors) == {kind}
    if kind == "http_503":
        assert "queue full" in result.error_samples[kind]


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_refused_connections_are_connect_errors():
    result = await ClosedLoop(_plan(Endpoint("127.0.0.1", _unused_port())), 2).run()
    assert result.ok == 0 and set(result.errors) == {"connect"}
    plan = _plan(Endpoint("127.0.0.1", _unused_port()))
    result = await OpenLoop(plan, 100.0, seed=0, max_connections=4).run()
    scheduled = round((result.offered_rate or 0) * result.duration_s)
    assert result.ok == 0 and result.errors == {"connect": scheduled}


async def test_open_loop_answers_and_statuses():
    async with _server(_ok) as endpoint:
        result = await OpenLoop(_plan(endpoint), 200.0, seed=1, max_connections=8).run()
    assert result.ok > 0 and result.errors == {}
    assert result.offered_rate is not None and result.offered_rate > 0
    assert result.service_latency is not None and result.service_latency.count == result.ok
    async with _server(_busy) as endpoint:
        result = await OpenLoop(_plan(endpoint), 200.0, seed=1, max_connections=8).run()
    assert result.ok == 0 and set(result.errors) == {"http_503"}


async def test_open_loop_never_drops_a_request_silently():
    async with _server(_hang) as endpoint:
        result = await OpenLoop(
            _plan(endpoint, timeout_s=0.1), 100.0, seed=2, max_connections=2
        ).run()
    # Every scheduled request is accounted for: answered, or an error of some kind.
    scheduled = round((result.offered_rate or 0) * result.duration_s)
    assert result.ok + result.error_count == scheduled
    assert set(result.errors) <= {"timeout", "connection"}


def _slot_plan(endpoint: Endpoint, slots: int) -> LoadPlan:
    """A plan whose slot ``k`` sends a body naming ``k``."""
    table = tuple(
        (
            http_request(
                endpoint.host_header,
                "POST",
                "/v2/models/m/infer",
                Body(f'{{"slot":{slot}}}'.encode(), (("Content-Type", "application/json"),)),
            ),
        )
        for slot in range(slots)
    )
    return dataclasses.replace(_plan(endpoint), requests=table[0], slot_requests=table)


def _recording(seen: set[bytes]) -> Behaviour:
    async def behaviour(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            seen.add(await reader.readexactly(length))
            writer.write(_answer("200 OK", b'{"outputs":[]}'))

    return behaviour  # type: ignore[return-value]


async def test_each_connection_sends_its_slots_requests():
    seen: set[bytes] = set()
    async with _server(_recording(seen)) as endpoint:
        plan = _slot_plan(endpoint, 3)
        result = await ClosedLoop(plan, 3).run()
        assert result.ok > 0 and result.errors == {}
        assert seen == {b'{"slot":0}', b'{"slot":1}', b'{"slot":2}'}
        with pytest.raises(ValueError, match="4 connections asked"):
            ClosedLoop(plan, 4)
        seen.clear()
        # The open loop holds no more connections than the plan has slots.
        result = await OpenLoop(plan, 300.0, seed=3, max_connections=64).run()
    assert result.ok > 0 and result.errors == {} and result.connections <= 3
    assert seen <= {b'{"slot":0}', b'{"slot":1}', b'{"slot":2}'}


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("http://127.0.0.1:8000", Endpoint("127.0.0.1", 8000, "")),
        ("127.0.0.1:9/prefix/", Endpoint("127.0.0.1", 9, "/prefix")),
        ("http://example.test", Endpoint("example.test", 80, "")),
    ],
)
def test_endpoints(url, endpoint):
    assert Endpoint.parse(url) == endpoint


@pytest.mark.parametrize("url", ["https://x", "http://", "http://h:port"])
def test_bad_endpoints(url):
    with pytest.raises(EndpointError):
        Endpoint.parse(url)
