"""Requests answered on the connection itself, past uvicorn's ASGI request cycle.

uvicorn turns every request into an ASGI scope, a request-response cycle with its event and
task, the message dicts of ``receive`` and ``send``, and a check of every response header.
For a small answer that machinery costs more than the exchange: a constant JSON answer took
27-29 µs of server CPU a request at 64 connections on uvicorn against 9 µs on httptools'
parser alone, 65-77 µs against 28 µs with one client; on the data plane's infer path,
answering directly served the Python-backend benchmark's model 1.06 / 1.12 / 1.15 times as
fast at 1 / 8 / 64 connections (bench/README.md, "HTTP past ASGI").

A server given `DirectRoutes` asks them, once a request's head is parsed, whether they answer
it. One that does gets the request's headers and whole body and returns its status, headers
and body, which go out in one send. Everything else about the connection stays uvicorn's,
because the request stands in uvicorn's place for a cycle (`DirectExchange` carries what
uvicorn reads of one): keep-alive and its timer, requests pipelined behind it (queued as
ASGI cycles and started once it is answered), a graceful shutdown (which waits for its task
and closes the connection after its answer), a client that goes away (its answer is dropped).

Only requests that need nothing of ASGI's body handling go direct: one Content-Length within
the route's bound (no chunked body, no refusal part way through one), no ``Expect:
100-continue``, no upgrade, nothing before them on the connection still unanswered. Every
other request is the ASGI app's, as before.
"""

from __future__ import annotations

import http
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

Headers = list[tuple[bytes, bytes]]
"""A request's headers as uvicorn parses them: names in lower case, in order."""


@dataclass(frozen=True, slots=True)
class DirectResponse:
    status: int
    headers: Sequence[tuple[bytes, bytes]]
    """Everything but ``content-length`` (and ``connection``), which the server writes."""
    body: bytes


DirectHandler = Callable[[Headers, bytes], Awaitable[DirectResponse]]
"""Answers one request from its headers and body. It should answer its errors itself; an
exception out of it is logged and answered 500 (``foundation.http.INTERNAL_ERROR``)."""


class DirectRoutes(Protocol):
    def route(
        self, method: bytes, path: bytes, state: Mapping[str, Any]
    ) -> tuple[DirectHandler, int] | None:
        """The handler of a request with this method and path (as sent: before any
        percent-decoding, without the query), and the largest body it takes; None leaves
        the request to the ASGI app. ``state`` is the app's lifespan state."""


class _Unwaited:
    """uvicorn sets its cycle's event when the connection is lost; nobody waits on this."""

    __slots__ = ()

    def set(self) -> None:
        pass


_UNWAITED: Final = _Unwaited()


class DirectExchange:
    """One request answered by a `DirectHandler`, standing where uvicorn keeps its request's
    cycle: uvicorn reads ``response_complete`` (an answer still owed queues what is
    pipelined behind it), sets ``keep_alive`` to False when the server shuts down and
    ``disconnected`` when the client goes away."""

    __slots__ = ("body", "disconnected", "handler", "headers", "keep_alive", "response_complete")

    message_event: Final = _UNWAITED

    def __init__(self, handler: DirectHandler, headers: Headers, *, keep_alive: bool) -> None:
        self.handler = handler
        self.headers = headers
        self.keep_alive = keep_alive
        self.body: list[bytes] = []
        self.response_complete = False
        self.disconnected = False

    async def answer(self) -> DirectResponse:
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        return await self.handler(self.headers, body)


def content_length(headers: Headers) -> int | None:
    """The request's Content-Length; None when it has none, more than one, or one that is
    not a plain decimal number."""
    found: int | None = None
    for name, value in headers:
        if name == b"content-length":
            if found is not None or not value.isdigit():
                return None
            found = int(value)
    return found


def response_bytes(
    response: DirectResponse, default_headers: Sequence[tuple[bytes, bytes]], *, keep_alive: bool
) -> bytes:
    """The whole HTTP/1.1 response: status line, the server's default headers (date,
    server), the response's, its length, ``connection: close`` when the connection ends."""
    status = response.status
    parts = [b"HTTP/1.1 %d %s\r\n" % (status, http.HTTPStatus(status).phrase.encode())]
    for name, value in default_headers:
        parts += (name, b": ", value, b"\r\n")
    for name, value in response.headers:
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"content-length: %d\r\n" % len(response.body))
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", response.body)
    return b"".join(parts)
