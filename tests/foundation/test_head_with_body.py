"""A response's head goes out with its body in one send (`foundation.http`): what a client
reads is unchanged (a real uvicorn server on loopback, raw sockets), a streamed body's head
is not held back until its first part, and the head and body of an ordinary response reach
the connection as one write.

How many sends a response took cannot be seen from the client (the kernel may join two sends
in one read), so that one property is checked against a recording stand-in for the
connection; everything else runs against the real server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from foundation.http import HeadWithBody, ServerLimits
from foundation.serving import HttpListener, bind_socket

pytestmark = pytest.mark.anyio

WAIT_S = 30.0


class _Recorded(asyncio.Transport):
    """The connection's side as the kernel would see it: each write, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


async def test_a_head_and_its_body_are_one_write() -> None:
    connection = _Recorded()
    response = HeadWithBody(connection, asyncio.get_running_loop())
    response.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    response.write(b"ok")
    assert connection.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
    await asyncio.sleep(0)  # the loop's next turn has nothing left to send
    assert len(connection.writes) == 1


async def test_a_head_without_a_body_in_the_same_step_goes_out_on_the_next_turn() -> None:
    connection = _Recorded()
    response = HeadWithBody(connection, asyncio.get_running_loop())
    response.write(b"HEAD")
    assert connection.writes == []
    await asyncio.sleep(0)
    assert connection.writes == [b"HEAD"]
    response.write(b"part 1")
    response.write(b"part 2")
    assert connection.writes == [b"HEAD", b"part 1", b"part 2"]


async def test_close_sends_a_held_head_first() -> None:
    connection = _Recorded()
    response = HeadWithBody(connection, asyncio.get_running_loop())
    response.write(b"HEAD")
    response.close()
    assert connection.writes == [b"HEAD"] and connection.closed and response.is_closing()
    await asyncio.sleep(0)
    assert connection.writes == [b"HEAD"]


@contextlib.asynccontextmanager
async def _serving(release: asyncio.Event) -> AsyncIterator[int]:
    async def plain(request: Request) -> Response:
        return PlainTextResponse("hello")

    async def stream(request: Request) -> Response:
        async def parts() -> AsyncIterator[bytes]:
            await asyncio.wait_for(release.wait(), WAIT_S)
            yield b"first"
            yield b"second"

        return StreamingResponse(parts(), media_type="text/plain")

    app = Starlette(routes=[Route("/plain", plain), Route("/stream", stream)])
    async with HttpListener(
        app,
        ServerLimits(),
        bind_socket("127.0.0.1", 0),
        name="test",
        drain_timeout_s=1.0,
        start_timeout_s=WAIT_S,
        stop_timeout_s=WAIT_S,
    ) as listener:
        yield int(listener.url.rsplit(":", 1)[1])


async def _read_until(reader: asyncio.StreamReader, end: bytes) -> bytes:
    return await asyncio.wait_for(reader.readuntil(end), WAIT_S)


async def test_clients_read_the_same_answers_on_a_kept_and_a_closed_connection() -> None:
    async with _serving(asyncio.Event()) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(3):  # kept alive: each response whole, in order
                writer.write(b"GET /plain HTTP/1.1\r\nhost: x\r\n\r\n")
                head = await _read_until(reader, b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 5" in head
                assert await asyncio.wait_for(reader.readexactly(5), WAIT_S) == b"hello"
            writer.write(b"GET /plain HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), WAIT_S)  # to the server's close
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nhello")
        finally:
            writer.close()


async def test_a_streamed_answers_head_comes_before_its_first_part() -> None:
    release = asyncio.Event()
    async with _serving(release) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
            head = await _read_until(reader, b"\r\n\r\n")  # while the body waits on release
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in head
            assert not release.is_set()
            release.set()
            body = await _read_until(reader, b"0\r\n\r\n")
            assert body == b"5\r\nfirst\r\n6\r\nsecond\r\n0\r\n\r\n"
        finally:
            writer.close()
