"""Requests answered past ASGI (`foundation.http_direct`), on a real uvicorn server on
loopback with raw sockets: a direct route answers what it routes and the app the rest, on
one connection in order (pipelined too), and the connection behaves as uvicorn's would:
keep-alive, HTTP/1.0 and ``Connection: close``, a failing handler, a client gone before its
answer, a graceful stop with an answer owed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send

from foundation.http_direct import (
    DirectHandler,
    DirectResponse,
    Headers,
    content_length,
    response_bytes,
)
from foundation.serving import HttpListener
from tests.foundation.listeners import loopback_listener

pytestmark = pytest.mark.anyio

WAIT_S = 30.0
MAX_BODY = 1000


class _Routes:
    """``POST /direct/<what>``: ``echo`` answers the body reversed, ``hold`` waits for
    ``release``, ``boom`` raises. Each answer carries ``x-direct``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.held = asyncio.Event()
        self.answered: list[bytes] = []

    def route(
        self, method: bytes, path: bytes, state: Mapping[str, Any]
    ) -> tuple[DirectHandler, int] | None:
        if method != b"POST" or not path.startswith(b"/direct/"):
            return None
        what = path.removeprefix(b"/direct/")

        async def answer(headers: Headers, body: bytes) -> DirectResponse:
            if what == b"boom":
                raise RuntimeError("boom")
            if what == b"hold":
                self.held.set()
                await self.release.wait()
            self.answered.append(body)
            return DirectResponse(200, [(b"x-direct", what)], body[::-1])

        return answer, MAX_BODY


async def _asgi(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = b"asgi:" + body
    headers = [(b"x-asgi", b"1"), (b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@contextlib.asynccontextmanager
async def _server(routes: _Routes) -> AsyncIterator[HttpListener]:
    async with loopback_listener(_asgi, direct=routes) as listener:
        yield listener


@contextlib.asynccontextmanager
async def _connect(
    listener: HttpListener,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, port = listener.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _post(path: str, body: bytes, *extra: str, version: str = "1.1") -> bytes:
    head = [f"POST {path} HTTP/{version}", "host: test", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    status_line, *lines = head.decode().split("\r\n")[:-2]
    headers = dict(line.lower().split(": ", 1) for line in lines)
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), WAIT_S)
    return int(status_line.split()[1]), headers, body


async def _closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), WAIT_S) == b""


# ---- the parts ----


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"host", b"x"), (b"content-length", b"12")], 12),
        ([(b"content-length", b"0")], 0),
        ([(b"host", b"x")], None),
        ([(b"content-length", b"12"), (b"content-length", b"12")], None),
        ([(b"content-length", b"+12")], None),
        ([(b"content-length", b"1e3")], None),
    ],
)
def test_content_length_is_one_plain_number(headers: Headers, expected: int | None) -> None:
    assert content_length(headers) == expected


def test_response_bytes_say_length_and_close() -> None:
    response = DirectResponse(404, [(b"content-type", b"application/json")], b'{"error":"x"}')
    defaults = [(b"server", b"uvicorn")]

    kept = response_bytes(response, defaults, keep_alive=True)
    closed = response_bytes(response, defaults, keep_alive=False)

    assert kept == (
        b"HTTP/1.1 404 Not Found\r\nserver: uvicorn\r\ncontent-type: application/json\r\n"
        b'content-length: 13\r\n\r\n{"error":"x"}'
    )
    assert closed == kept.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n")


# ---- on a real server ----


async def test_routed_requests_are_answered_directly_and_the_rest_by_the_app() -> None:
    routes = _Routes()
    async with _server(routes) as listener, _connect(listener) as (reader, writer):
        for path, body in [("/direct/echo", b"abc"), ("/other", b"xyz"), ("/direct/echo", b"")]:
            writer.write(_post(path, body))
            await writer.drain()
            answers = await _response(reader)
            if path == "/other":
                assert answers[0] == 200 and answers[2] == b"asgi:xyz"
                assert "x-asgi" in answers[1] and "x-direct" not in answers[1]
            else:
                assert answers[0] == 200 and answers[2] == body[::-1]
                assert answers[1]["x-direct"] == "echo" and "connection" not in answers[1]
            assert "date" in answers[1] and "server" in answers[1]  # the server's defaults
    assert routes.answered == [b"abc", b""]


async def test_pipelined_requests_are_answered_in_order() -> None:
    routes = _Routes()
    async with _server(routes) as listener, _connect(listener) as (reader, writer):
        # All three in one write: the held one is owed while the others arrive behind it.
        writer.write(
            _post("/direct/hold", b"first")
            + _post("/other", b"second")
            + _post("/direct/echo", b"3")
        )
        await writer.drain()
        await asyncio.wait_for(routes.held.wait(), WAIT_S)
        await asyncio.sleep(0.1)  # let anything answered early show (nothing may)
        routes.release.set()
        answers = [await _response(reader) for _ in range(3)]
    # What arrives behind an owed answer is queued as uvicorn queues it, as ASGI cycles.
    assert [a[2] for a in answers] == [b"tsrif", b"asgi:second", b"asgi:3"]


async def test_what_needs_asgis_body_handling_goes_to_the_app() -> None:
    routes = _Routes()
    too_big = b"x" * (MAX_BODY + 1)
    chunked = (
        b"POST /direct/echo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n0\r\n\r\n"
    )
    expecting = _post("/direct/echo", b"abc", "expect: 100-continue")
    async with _server(routes) as listener, _connect(listener) as (reader, writer):
        writer.write(_post("/direct/echo", too_big))
        big = await _response(reader)
        writer.write(chunked)
        in_chunks = await _response(reader)
        writer.write(expecting)
        await asyncio.wait_for(reader.readuntil(b"100 Continue\r\n\r\n"), WAIT_S)
        expected = await _response(reader)
    assert big[2] == b"asgi:" + too_big
    assert in_chunks[2] == b"asgi:abc"
    assert expected[2] == b"asgi:abc"
    assert routes.answered == []


async def test_http_1_0_and_connection_close_end_the_connection_after_the_answer() -> None:
    routes = _Routes()
    async with _server(routes) as listener:
        async with _connect(listener) as (reader, writer):
            writer.write(_post("/direct/echo", b"ab", version="1.0"))
            old = await _response(reader)
            assert await _closed(reader)
        async with _connect(listener) as (reader, writer):
            writer.write(_post("/direct/echo", b"cd", "connection: close"))
            told = await _response(reader)
            assert await _closed(reader)
    assert (old[2], told[2]) == (b"ba", b"dc")
    assert old[1]["connection"] == told[1]["connection"] == "close"


async def test_a_failing_handler_is_a_500_and_the_connection_goes_on() -> None:
    routes = _Routes()
    async with _server(routes) as listener, _connect(listener) as (reader, writer):
        writer.write(_post("/direct/boom", b"x"))
        failed = await _response(reader)
        writer.write(_post("/direct/echo", b"ok"))
        after = await _response(reader)
    assert failed[0] == 500
    assert failed[2] == b'{"error":"internal server error"}'
    assert failed[1]["content-type"] == "application/json"
    assert after[:1] == (200,) and after[2] == b"ko"


async def test_a_client_gone_before_its_answer_leaves_the_server_serving() -> None:
    routes = _Routes()
    async with _server(routes) as listener:
        async with _connect(listener) as (_, writer):
            writer.write(_post("/direct/hold", b"lost"))
            await writer.drain()
            await asyncio.wait_for(routes.held.wait(), WAIT_S)
        await asyncio.sleep(0.1)  # the server sees the connection end
        routes.release.set()
        async with _connect(listener) as (reader, writer):
            writer.write(_post("/direct/echo", b"next"))
            after = await _response(reader)
    assert routes.answered[0] == b"lost"  # the handler ran to its end; its answer was dropped
    assert after[2] == b"txen"


async def test_a_graceful_stop_waits_for_an_owed_answer_and_then_closes() -> None:
    routes = _Routes()
    listener = loopback_listener(_asgi, direct=routes)
    await listener.__aenter__()
    stopped = False
    try:
        async with _connect(listener) as (reader, writer):
            writer.write(_post("/direct/hold", b"owed"))
            await writer.drain()
            await asyncio.wait_for(routes.held.wait(), WAIT_S)
            stopping = asyncio.create_task(listener.__aexit__(None, None, None))
            await asyncio.sleep(0.2)
            assert not stopping.done()  # draining: the answer is owed
            routes.release.set()
            answer = await _response(reader)
            assert await _closed(reader)
            await asyncio.wait_for(stopping, WAIT_S)
            stopped = True
    finally:
        if not stopped:
            routes.release.set()
            await listener.__aexit__(None, None, None)
    assert answer[2] == b"dewo"
    assert answer[1]["connection"] == "close"
