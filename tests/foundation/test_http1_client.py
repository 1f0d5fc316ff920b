"""The HTTP/1.1 client connection against a raw TCP server on loopback that answers exactly
as told: what its receiver hears, in which order, and when the connection may be reused."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from foundation.http1_client import Failure, Http1Connection

pytestmark = pytest.mark.anyio

WAIT_S = 30.0
"""Bound on every wait; reached only when something is broken."""

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(params=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    """Both loops its users run on: uvloop's transports are not asyncio's classes."""
    return ("asyncio", {"use_uvloop": request.param == "uvloop"})


@dataclass
class Recorder:
    """A receiver that writes down every event and wakes whoever waits for the end."""

    events: list[tuple[object, ...]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def answer_head(
        self, status: int, is_keep_alive: bool, headers: list[tuple[bytes, bytes]]
    ) -> None:
        self.events.append(("head", status, is_keep_alive, list(headers)))

    def answer_body(self, chunk: bytes) -> None:
        self.events.append(("body", chunk))
        self.chunks.append(chunk)

    def answer_complete(self) -> None:
        self.events.append(("complete",))
        self.done.set()

    def answer_failed(self, failure: Failure, cause: Exception | None) -> None:
        self.events.append(("failed", failure))
        self.done.set()

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


class Connection(Http1Connection):
    def __init__(self, *, keep_headers: bool = False) -> None:
        super().__init__(keep_headers=keep_headers)
        self.closed = asyncio.Event()

    def connection_closed(self) -> None:
        self.closed.set()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


def _answer(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n" % (len(body), extra) + body


@contextlib.asynccontextmanager
async def _connected(script: Script, **options: bool) -> AsyncIterator[Connection]:
    """A connection to a server that runs ``script`` on it."""
    tasks: set[asyncio.Task[None]] = set()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                await script(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    _, connection = await loop.create_connection(lambda: Connection(**options), "127.0.0.1", port)
    try:
        async with asyncio.timeout(WAIT_S):
            yield connection
    finally:
        connection.close(abort=True)
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


async def _exchange(connection: Connection) -> Recorder:
    """POST two bytes and wait for the answer's end."""
    recorder = Recorder()
    connection.write_request(recorder, b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\n", b"hi")
    await recorder.done.wait()
    return recorder


async def test_an_answer_is_told_head_body_complete_and_the_connection_is_reused() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for body in (b"first", b"second"):
            await _read_request(reader)
            writer.write(_answer(body, b"X-Thing: Yes\r\n"))
        await reader.read()

    async with _connected(serve) as connection:
        first = await _exchange(connection)
        assert [e[0] for e in first.events] == ["head", "body", "complete"]
        assert first.events[0] == ("head", 200, True, [])
        assert first.body == b"first"
        assert connection.is_reusable and connection.receiver is None
        second = await _exchange(connection)
        assert second.body == b"second"


async def test_headers_are_kept_lower_cased_when_asked() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_answer(b"ok", b"X-Thing: Yes\r\n"))
        await reader.read()

    async with _connected(serve, keep_headers=True) as connection:
        recorder = await _exchange(connection)
        assert recorder.events[0] == (
            "head",
            200,
            True,
            [(b"content-length", b"2"), (b"x-thing", b"Yes")],
        )


async def test_an_interim_100_is_skipped() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\nx-interim: 1\r\n\r\n" + _answer(b"ok"))
        await reader.read()

    async with _connected(serve, keep_headers=True) as connection:
        recorder = await _exchange(connection)
        assert recorder.events == [
            ("head", 200, True, [(b"content-length", b"2")]),
            ("body", b"ok"),
            ("complete",),
        ]


async def test_a_chunked_answer_arrives_without_its_framing() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        )
        await reader.read()

    async with _connected(serve) as connection:
        recorder = await _exchange(connection)
        assert recorder.body == b"hello world"
        assert recorder.events[-1] == ("complete",)
        assert connection.is_reusable


async def test_an_answer_saying_close_closes_the_connection() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_answer(b"bye", b"connection: close\r\n"))
        await reader.read()

    async with _connected(serve) as connection:
        recorder = await _exchange(connection)
        assert recorder.events[0] == ("head", 200, False, [])
        assert recorder.events[-1] == ("complete",)
        assert not connection.is_reusable
        await connection.closed.wait()


async def test_an_answer_to_head_ends_at_its_head() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        # Content-Length says what a GET would carry; no body follows an answer to HEAD.
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
        await reader.read()

    async with _connected(serve) as connection:
        recorder = Recorder()
        connection.write_request(recorder, b"HEAD / HTTP/1.1\r\n\r\n", is_head=True)
        await recorder.done.wait()
        assert recorder.events == [("head", 200, False, []), ("complete",)]
        await connection.closed.wait()


async def test_garbage_is_a_protocol_failure() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"this is not HTTP\r\n\r\n")
        await reader.read()

    async with _connected(serve) as connection:
        recorder = await _exchange(connection)
        assert recorder.events == [("failed", Failure.PROTOCOL)]
        await connection.closed.wait()


async def test_a_close_before_any_answer_byte_is_told_apart_from_one_during_the_answer() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf")
        await writer.drain()

    async with _connected(silent) as connection:
        recorder = await _exchange(connection)
        assert recorder.events == [("failed", Failure.CLOSED_BEFORE_ANSWER)]
        await connection.closed.wait()
        assert connection.is_closed and not connection.is_reusable
    async with _connected(cut) as connection:
        recorder = await _exchange(connection)
        assert recorder.events[-1] == ("failed", Failure.CLOSED_DURING_ANSWER)
        assert recorder.body == b"half"


async def test_bytes_nobody_asked_for_close_the_connection() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_answer(b"unasked"))
        await reader.read()

    async with _connected(serve) as connection:
        await connection.closed.wait()
        assert connection.is_closed and not connection.is_reusable


async def test_a_large_body_goes_out_whole() -> None:
    received: list[bytes] = []
    body = bytes(range(256)) * 1024

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        received.append(await reader.readexactly(len(body)))
        writer.write(_answer(b"ok"))
        await reader.read()

    async with _connected(serve) as connection:
        recorder = Recorder()
        head = b"POST / HTTP/1.1\r\ncontent-length: %d\r\n\r\n" % len(body)
        connection.write_request(recorder, head, body)
        if connection.is_write_paused:
            await connection.wait_drained()
        await recorder.done.wait()
        assert received == [body]
        assert recorder.body == b"ok"
