"""The upstream pool against raw TCP servers on loopback that answer exactly as told."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from activator.upstream import (
    UpstreamConnectError,
    UpstreamPool,
    UpstreamPoolTimeoutError,
    UpstreamProtocolError,
    UpstreamReadTimeoutError,
    UpstreamTimeouts,
)
from tests.integration.conftest import free_port

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    """Both loops the activator runs on: uvloop's transports are not asyncio's classes."""
    return ("asyncio", {"use_uvloop": request.param == "uvloop"})


WAIT_S = 30.0
"""Bound on every wait; reached only when something is broken."""

Handler = Callable[["Exchange"], Awaitable[None]]


@dataclass
class Exchange:
    """One request as the server read it, and the connection to answer on."""

    head: bytes
    body: bytes
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    connection: int
    """Which connection (in order of arrival) carried it."""


@dataclass
class Server:
    url: str
    exchanges: list[Exchange] = field(default_factory=list)
    connections: int = 0
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def wait_for_exchanges(self, count: int) -> None:
        async with self.arrived:
            await self.arrived.wait_for(lambda: len(self.exchanges) >= count)


def _ok(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n" + b"".join(extra)
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


@contextlib.asynccontextmanager
async def _server(handle: Handler) -> AsyncIterator[Server]:
    """Reads requests (head + ``Content-Length`` body) in a loop and hands each to ``handle``;
    the connection ends when ``handle`` closes it or the client does."""
    tasks: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []
    state = Server(url="")

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        state.connections += 1
        number = state.connections
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            while not writer.is_closing():
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                exchange = Exchange(head, body, reader, writer, number)
                async with state.arrived:
                    state.exchanges.append(exchange)
                    state.arrived.notify_all()
                await handle(exchange)
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
        finally:
            writer.close()
            tasks.discard(task)

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield state
    finally:
        for writer in writers:
            writer.close()
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


@contextlib.asynccontextmanager
async def _pool(**overrides: float) -> AsyncIterator[UpstreamPool]:
    timeouts = {"connect_s": 5.0, "read_s": WAIT_S, "write_s": WAIT_S, "pool_s": 5.0}
    limits = {"max_connections": 10, "max_idle_connections": 10, "idle_expiry_s": 60.0}
    for key, value in overrides.items():
        if key in timeouts:
            timeouts[key] = value
        else:
            limits[key] = value
    pool = UpstreamPool(
        UpstreamTimeouts(**timeouts),
        max_connections=int(limits["max_connections"]),
        max_idle_connections=int(limits["max_idle_connections"]),
        idle_expiry_s=limits["idle_expiry_s"],
    )
    try:
        async with asyncio.timeout(WAIT_S):
            yield pool
    finally:
        await pool.aclose()


async def _echo(exchange: Exchange) -> None:
    exchange.writer.write(_ok(exchange.body or b"empty"))


async def _read_all(pool: UpstreamPool, url: str, body: bytes = b"x") -> tuple[int, bytes]:
    response = await pool.request(url, "POST", "/v2/models/m/infer", [], body)
    try:
        return response.status, b"".join([chunk async for chunk in response.chunks()])
    finally:
        response.close()


async def test_the_request_goes_out_as_given_with_host_and_length() -> None:
    async with _server(_echo) as server, _pool() as pool:
        headers = [(b"content-type", b"application/json"), (b"x-request-id", b"abc")]
        response = await pool.request(
            server.url, "POST", "/v2/models/m/infer?x=%41", headers, b"{}"
        )
        assert response.status == 200
        assert (b"content-type", b"text/plain") in response.headers
        assert response.is_complete
        assert response.take_buffered() == b"{}"
        response.close()
    authority = server.url.removeprefix("http://").encode()
    assert server.exchanges[0].head == (
        b"POST /v2/models/m/infer?x=%41 HTTP/1.1\r\nhost: " + authority + b"\r\n"
        b"content-type: application/json\r\nx-request-id: abc\r\ncontent-length: 2\r\n\r\n"
    )


async def test_a_get_without_body_carries_no_length() -> None:
    async with _server(_echo) as server, _pool() as pool:
        response = await pool.request(server.url, "GET", "/v2/models/m", [], b"")
        response.close()
    assert b"content-length" not in server.exchanges[0].head


async def test_connections_are_kept_alive_and_reused() -> None:
    async with _server(_echo) as server, _pool() as pool:
        for index in range(5):
            assert await _read_all(pool, server.url, b"%d" % index) == (200, b"%d" % index)
        assert server.connections == 1
        assert pool.open_connections == 1


async def test_an_idle_connection_the_worker_closed_is_replaced_transparently() -> None:
    async def answer_then_close(exchange: Exchange) -> None:
        exchange.writer.write(_ok(exchange.body))
        await exchange.writer.drain()
        exchange.writer.close()

    async with _server(answer_then_close) as server, _pool() as pool:
        assert await _read_all(pool, server.url, b"one") == (200, b"one")
        assert await _read_all(pool, server.url, b"two") == (200, b"two")
    assert server.connections == 2


async def test_a_reused_connection_closed_before_answering_is_retried_once() -> None:
    """The race the idle expiry narrows: the worker drops a kept-alive connection just as a
    request goes out on it. The request is sent again on a fresh connection."""

    async def close_second_request(exchange: Exchange) -> None:
        if exchange.connection == 1 and exchange.body == b"two":
            exchange.writer.close()
            return
        exchange.writer.write(_ok(exchange.body))

    async with _server(close_second_request) as server, _pool() as pool:
        assert await _read_all(pool, server.url, b"one") == (200, b"one")
        assert await _read_all(pool, server.url, b"two") == (200, b"two")
    assert [e.connection for e in server.exchanges] == [1, 1, 2]


async def test_a_fresh_connection_closed_before_answering_is_a_protocol_error() -> None:
    async def hang_up(exchange: Exchange) -> None:
        exchange.writer.close()

    async with _server(hang_up) as server, _pool() as pool:
        with pytest.raises(UpstreamProtocolError, match="closed"):
            await pool.request(server.url, "POST", "/", [], b"x")
    assert len(server.exchanges) == 1


async def test_nobody_listening_is_a_connect_error() -> None:
    async with _pool() as pool:
        with pytest.raises(UpstreamConnectError):
            await pool.request(f"http://127.0.0.1:{free_port()}", "POST", "/", [], b"x")
        assert pool.open_connections == 0


async def test_an_unsupported_url_is_a_connect_error() -> None:
    async with _pool() as pool:
        with pytest.raises(UpstreamConnectError, match="http://"):
            await pool.request("https://example.invalid", "GET", "/", [], b"")


async def test_silence_past_the_read_timeout() -> None:
    async def stay_silent(exchange: Exchange) -> None:
        await exchange.reader.read()

    async with _server(stay_silent) as server, _pool(read_s=0.1) as pool:
        with pytest.raises(UpstreamReadTimeoutError):
            await pool.request(server.url, "POST", "/", [], b"x")
        assert pool.open_connections == 0


async def test_silence_mid_body_past_the_read_timeout() -> None:
    async def stall(exchange: Exchange) -> None:
        exchange.writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345")
        await exchange.writer.drain()
        await exchange.reader.read()

    async with _server(stall) as server, _pool(read_s=0.1) as pool:
        response = await pool.request(server.url, "POST", "/", [], b"x")
        chunks = response.chunks()
        assert await anext(chunks) == b"12345"
        with pytest.raises(UpstreamReadTimeoutError):
            await anext(chunks)
        response.close()
        assert pool.open_connections == 0


async def test_a_chunked_answer_streams_piece_by_piece() -> None:
    go_on = asyncio.Event()

    async def stream(exchange: Exchange) -> None:
        writer = exchange.writer
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await go_on.wait()
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")

    async with _server(stream) as server, _pool() as pool:
        response = await pool.request(server.url, "POST", "/", [], b"x")
        assert not response.is_complete
        chunks = response.chunks()
        assert await anext(chunks) == b"first"
        go_on.set()
        assert b"".join([chunk async for chunk in chunks]) == b"second"
        assert response.is_complete
        response.close()
        # Read to its end, the connection goes back for the next request.
        assert pool.open_connections == 1
        assert await _read_all(pool, server.url) == (200, b"firstsecond")
    assert server.connections == 1


async def test_a_connection_cut_mid_body_is_a_protocol_error() -> None:
    async def cut(exchange: Exchange) -> None:
        exchange.writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345")
        await exchange.writer.drain()
        exchange.writer.close()

    async with _server(cut) as server, _pool() as pool:
        response = await pool.request(server.url, "POST", "/", [], b"x")
        with pytest.raises(UpstreamProtocolError):
            _ = [chunk async for chunk in response.chunks()]
        response.close()


async def test_garbage_is_a_protocol_error() -> None:
    async def garble(exchange: Exchange) -> None:
        exchange.writer.write(b"NOT HTTP AT ALL\r\n\r\n")

    async with _server(garble) as server, _pool() as pool:
        with pytest.raises(UpstreamProtocolError, match="invalid HTTP"):
            await pool.request(server.url, "POST", "/", [], b"x")
        assert pool.open_connections == 0


async def test_an_answer_to_head_has_no_body_whatever_its_length_says() -> None:
    async def head(exchange: Exchange) -> None:
        exchange.writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1234\r\n\r\n")

    async with _server(head) as server, _pool() as pool:
        response = await pool.request(server.url, "HEAD", "/v2/models/m", [], b"")
        assert response.is_complete
        assert (b"content-length", b"1234") in response.headers
        assert [chunk async for chunk in response.chunks()] == []
        response.close()


async def test_an_interim_100_is_skipped() -> None:
    async def continue_then_answer(exchange: Exchange) -> None:
        exchange.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(b"done"))

    async with _server(continue_then_answer) as server, _pool() as pool:
        assert await _read_all(pool, server.url) == (200, b"done")


async def test_large_bodies_pass_both_ways_intact() -> None:
    body = bytes(range(256)) * (3 * 2**20 // 256)  # over the read buffer's high-water mark

    async with _server(_echo) as server, _pool() as pool:
        response = await pool.request(server.url, "POST", "/", [], body)
        await asyncio.sleep(0.05)  # let the buffer fill past the mark and reading pause
        received = b"".join([chunk async for chunk in response.chunks()])
        response.close()
        assert received == body
        assert await _read_all(pool, server.url, b"after") == (200, b"after")
    assert server.connections == 1


async def test_a_full_pool_makes_callers_wait_then_time_out() -> None:
    release = asyncio.Event()

    async def hold(exchange: Exchange) -> None:
        await release.wait()
        exchange.writer.write(_ok(b"late"))

    async with _server(hold) as server, _pool(max_connections=1, pool_s=0.1) as pool:
        held = asyncio.create_task(_read_all(pool, server.url))
        await server.wait_for_exchanges(1)
        with pytest.raises(UpstreamPoolTimeoutError):
            await pool.request(server.url, "POST", "/", [], b"x")
        release.set()
        assert await held == (200, b"late")


async def test_a_caller_waiting_for_a_connection_gets_the_one_freed() -> None:
    release = asyncio.Event()

    async def hold(exchange: Exchange) -> None:
        await release.wait()
        exchange.writer.write(_ok(exchange.body))

    async with _server(hold) as server, _pool(max_connections=1) as pool:
        first = asyncio.create_task(_read_all(pool, server.url, b"1"))
        await server.wait_for_exchanges(1)
        second = asyncio.create_task(_read_all(pool, server.url, b"2"))
        await asyncio.sleep(0.02)  # (either order of these two is a pass)
        release.set()
        assert await first == (200, b"1")
        assert await second == (200, b"2")
        assert pool.open_connections == 1


async def test_idle_connections_beyond_the_bound_are_closed() -> None:
    release = asyncio.Event()

    async def hold(exchange: Exchange) -> None:
        await release.wait()
        exchange.writer.write(_ok(b"ok"))

    async with _server(hold) as server, _pool(max_idle_connections=1) as pool:
        requests = [asyncio.create_task(_read_all(pool, server.url)) for _ in range(3)]
        await server.wait_for_exchanges(3)
        assert pool.open_connections == 3
        release.set()
        assert await asyncio.gather(*requests) == [(200, b"ok")] * 3
        assert pool.open_connections == 1


async def test_expired_idle_connections_are_not_reused() -> None:
    async with _server(_echo) as server, _pool(idle_expiry_s=0.0) as pool:
        assert await _read_all(pool, server.url, b"a") == (200, b"a")
        await asyncio.sleep(0.01)
        assert await _read_all(pool, server.url, b"b") == (200, b"b")
    assert server.connections == 2


async def test_closing_the_pool_closes_busy_connections() -> None:
    async def stay_silent(exchange: Exchange) -> None:
        await exchange.reader.read()

    async with _server(stay_silent) as server:
        async with _pool() as pool:
            pending = asyncio.create_task(pool.request(server.url, "POST", "/", [], b"x"))
            await server.wait_for_exchanges(1)
        with pytest.raises(UpstreamProtocolError):
            await pending
