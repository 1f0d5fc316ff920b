"""HTTP plumbing every zeroserve server shares: error bodies, status lookup, connection
limits.

Each component keeps its own error table (its ``http_errors`` module); this module holds the
mechanics they have in common so that an error looks the same whichever server answers it, and
the bounds (`ServerLimits`) every server puts on its clients' connections. Starting,
draining and stopping a server is `foundation.serving`'s.
"""

from __future__ import annotations

import asyncio
import http
import itertools
import logging
from asyncio import TimerHandle
from collections.abc import Mapping
from typing import Any, ClassVar, Final

import httptools
import orjson
import uvicorn
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from foundation.http_direct import (
    DirectExchange,
    DirectResponse,
    DirectRoutes,
    content_length,
    response_bytes,
)

logger = logging.getLogger(__name__)

_LINGER_S: Final = 2.0
"""After refusing a request, how long its connection keeps reading (and dropping) what the
client still sends: closing with unread data makes the kernel reset the connection, and the
client loses the answer."""
_WARN_EVERY_S: Final = 10.0
_RESCAN_AFTER_S: Final = 0.1
_connection_numbers: Final = itertools.count()


def error_response(
    message: str,
    status: int,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Response:
    """The Open Inference Protocol error body ``{"error": "<message>", **extra}``, as JSON."""
    return Response(
        orjson.dumps({"error": message, **(extra or {})}),
        status_code=status,
        media_type="application/json",
        headers=dict(headers) if headers else None,
    )


def direct_response(response: Response) -> DirectResponse:
    """``response`` as a direct route returns it: status, headers but content-length (which
    the sender writes), body."""
    headers = [header for header in response.raw_headers if header[0] != b"content-length"]
    return DirectResponse(response.status_code, headers, bytes(response.body))


INTERNAL_ERROR: Final = direct_response(error_response("internal server error", 500))
"""The generic 500 of an unexpected failure, as :func:`handle_unexpected` answers it."""


def status_for(error: BaseException, table: Mapping[type[BaseException], int]) -> int:
    """The status of ``error``: that of the nearest class in its MRO in ``table``, else 500."""
    for cls in type(error).__mro__:
        status = table.get(cls)
        if status is not None:
            return status
    return 500


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's 404/405 (and other HTTP exceptions) as the JSON error body."""
    assert isinstance(exc, HTTPException)
    text = {404: "Not Found", 405: "Method Not Allowed"}.get(exc.status_code, exc.detail)
    return error_response(text, exc.status_code, dict(exc.headers or {}))


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    """Any other exception: a generic 500; the traceback goes only to the log."""
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response("internal server error", 500)


class ServerLimits(BaseModel):
    """The bounds a zeroserve HTTP server puts on its clients' connections.

    Mixed into each server's settings (``class ActivatorSettings(BaseSettings, ServerLimits)``),
    so each reads them under its own environment prefix, e.g.
    ``ZEROSERVE_ACTIVATOR_MAX_HEADER_BYTES``. uvicorn bounds none of these on httptools.
    """

    model_config = ConfigDict(frozen=True)

    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    """Largest request line and headers together; past it the answer is 431 (Triton resets
    the connection at 1 MiB, nginx answers past 8-32 KiB)."""
    max_headers: int = Field(default=100, ge=8)
    """Most header fields in one request; past it the answer is 431."""
    header_timeout_s: float = Field(default=30.0, gt=0)
    """How long a client may take to send a request line and headers, counted from its first
    byte (from connecting for a connection's first request); then 408 and the connection
    closes (slowloris). A new connection that sends nothing is closed without an answer."""
    body_timeout_s: float = Field(default=60.0, gt=0)
    """Longest pause in a request body the server is waiting to read; then the connection
    closes (the request fails as a disconnect)."""
    keep_alive_timeout_s: int = Field(default=5, gt=0)
    """How long a connection may stay idle between requests before the server closes it."""
    max_connections: int = Field(default=4096, gt=0)
    """Connections open at once. A new one past it closes the connection idle longest (between
    requests, or not yet sending); when none is idle it is answered 503 and closed."""


def http_config(
    app: ASGIApp, limits: ServerLimits, *, direct: DirectRoutes | None = None, **options: Any
) -> uvicorn.Config:
    """A uvicorn configuration serving ``app`` under ``limits``, the requests ``direct``
    routes taking past ASGI (`foundation.http_direct`); ``options`` are uvicorn's."""
    return uvicorn.Config(
        app,
        http=limited_http_protocol(limits, direct),
        timeout_keep_alive=limits.keep_alive_timeout_s,
        **options,
    )


def limited_http_protocol(
    limits: ServerLimits, direct: DirectRoutes | None = None
) -> type[LimitedHttpProtocol]:
    """The protocol class of one server, holding ``limits``, its direct routes and the
    server's own counters."""

    class _ServerProtocol(LimitedHttpProtocol):
        pass

    _ServerProtocol.limits = limits
    _ServerProtocol.direct = direct
    _ServerProtocol.refused_connections = 0
    return _ServerProtocol


class HeadWithBody(asyncio.Transport):
    """The connection as one response sees it: its head goes out with the first body write.

    uvicorn writes a response's head and its body separately, two sends where one does: the
    client wakes for the head, then again for the body, and the server pays a system call
    more per answer. The head waits until the body is written in the same step of the event
    loop (Starlette sends both without waiting), and at most until the loop's next turn (a
    streamed body's first part may come much later; the client then has the head at once).
    """

    __slots__ = ("_connection", "_head", "_loop", "_waiting")

    def __init__(self, connection: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._connection = connection
        self._head: bytes | None = None
        self._waiting = True
        self._loop = loop

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._waiting:
            self._waiting = False
            self._head = bytes(data)
            self._loop.call_soon(self._send_head)
        elif self._head is not None:
            head, self._head = self._head, None
            self._connection.write(head + data)
        else:
            self._connection.write(data)

    def _send_head(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            if not self._connection.is_closing():
                self._connection.write(head)

    def close(self) -> None:
        self._send_head()
        self._connection.close()

    def is_closing(self) -> bool:
        return self._connection.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._connection.get_extra_info(name, default)


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is refused."""


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with `ServerLimits` enforced.

    A head is measured from the bytes received while it is incomplete (httptools holds a
    header in progress unseen until it ends), and exactly once complete. Refusals are written
    here, as uvicorn writes its 400: no application task exists for a refused head. The
    requests that pass cost a few attribute updates and no timer: a head timer starts only
    when a read ends inside a head, a body timer only when one ends inside a body. Use
    `limited_http_protocol`, which gives each server its own class.
    """

    limits: ClassVar[ServerLimits]
    direct: ClassVar[DirectRoutes | None] = None
    refused_connections: ClassVar[int] = 0
    warned_at: ClassVar[float] = float("-inf")
    scan_after: ClassVar[float] = float("-inf")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # between requests, or reading a request line and headers
        self._heads_done = 0
        self._head_started = False
        self._head_received = 0  # bytes of the current head in earlier reads
        self._read_size = 0
        self._head_timer: TimerHandle | None = None
        self._body_timer: TimerHandle | None = None
        self._body_read_at = 0.0
        self._refusal: tuple[int, str] | None = None
        self._linger: TimerHandle | None = None
        self._number = 0
        self._exchange: DirectExchange | None = None  # a direct request being received

    # Connection events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._number = next(_connection_numbers)
        if len(self.connections) > self.limits.max_connections and not self._close_idlest():
            self._note_refused_connection()
            self._refuse(503, "too many connections; retry later", b"retry-after: 1\r\n")
            return
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._body_timer, self._linger):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return  # lingering: dropped unread
        was_in_head, heads_done = self._in_head, self._heads_done
        self._read_size = len(data)
        super().data_received(data)
        if self._refusal is not None or self.transport.is_closing():
            return
        if self._in_head:
            if not self._head_started:
                return  # between requests
            if was_in_head and heads_done == self._heads_done:
                # The whole read was head: with a header in progress httptools does not show.
                self._head_received += len(data)
                if self._head_received > self.limits.max_header_bytes:
                    self._refuse(*self._too_many_bytes())
                    return
                if len(self.headers) > self.limits.max_headers:
                    self._refuse(*self._too_many_fields())
                    return
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(
                    self.limits.header_timeout_s, self._head_late
                )
        elif self._body_timer is None:
            self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_late)
            self._body_read_at = self.loop.time()
        else:
            self._body_read_at = self.loop.time()

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to a parser error, which a refusing callback raises.
        if self._refusal is not None:
            self._refuse(*self._refusal)
        else:
            super().send_400_response(msg)

    # Parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_started = True

    def on_headers_complete(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if len(self.headers) > self.limits.max_headers:
            self._refusal = self._too_many_fields()
            raise _Refused
        # Received bytes bound the head; measured exactly only when they could exceed it.
        if self._head_received + self._read_size > self.limits.max_header_bytes:
            size = len(self.url) + sum(len(name) + len(value) for name, value in self.headers)
            if size > self.limits.max_header_bytes:
                self._refusal = self._too_many_bytes()
                raise _Refused
        self._in_head = self._head_started = False
        self._heads_done += 1
        self._head_received = 0
        if self.direct is not None and self._take_directly(self.direct):
            return
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:  # not an upgrade, which makes no cycle
            self.cycle.transport = HeadWithBody(self.transport, self.loop)

    def on_body(self, body: bytes) -> None:
        if self._exchange is not None:
            self._exchange.body.append(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        exchange = self._exchange
        if exchange is not None:
            self._exchange = None
            task = self.loop.create_task(self._answer_directly(exchange))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)
        else:
            super().on_message_complete()
        self._in_head = True
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    # Requests answered directly (foundation.http_direct)

    def _take_directly(self, direct: DirectRoutes) -> bool:
        """Whether the request whose head just ended is answered by a direct route; if so
        it stands as the connection's cycle from now until its answer is sent."""
        parser = self.parser
        if self.expect_100_continue or parser.should_upgrade():
            return False
        if self.cycle is not None and not self.cycle.response_complete:
            return False  # pipelined behind an answer still owed: uvicorn queues it
        path = httptools.parse_url(self.url).path
        routed = direct.route(parser.get_method(), path, self.app_state)
        if routed is None:
            return False
        handler, max_body_bytes = routed
        length = content_length(self.headers)
        if length is None or length > max_body_bytes:
            return False
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        exchange = DirectExchange(handler, self.headers, keep_alive=keep_alive)
        self._exchange = exchange
        self.cycle = exchange  # type: ignore[assignment]  # what uvicorn reads of a cycle
        return True

    async def _answer_directly(self, exchange: DirectExchange) -> None:
        try:
            response = await exchange.answer()
        except Exception:
            logger.exception("a direct route failed")
            response = INTERNAL_ERROR
        exchange.response_complete = True
        if self.transport.is_closing():
            return  # the client went away, or the server is closing it
        # Read now: a shutdown meanwhile turned keep-alive off.
        keep_alive = exchange.keep_alive
        default_headers = self.server_state.default_headers
        self.transport.write(response_bytes(response, default_headers, keep_alive=keep_alive))
        if not keep_alive:
            self.transport.close()
        # As after a cycle's answer: counted, and what was pipelined behind it starts.
        self.on_response_complete()

    # Limits

    def _too_many_bytes(self) -> tuple[int, str]:
        limit = self.limits.max_header_bytes
        return 431, f"request header fields too large: more than {limit} bytes"

    def _too_many_fields(self) -> tuple[int, str]:
        limit = self.limits.max_headers
        return 431, f"request header fields too large: more than {limit} fields"

    def _idle_since(self) -> tuple[float, int] | None:
        """When this connection became idle (between requests, or connected and silent), and
        its number, which orders connections of one loop iteration (they share its time)."""
        if self._head_started or (self.cycle is not None and not self.cycle.response_complete):
            return None  # a request under way
        if self.timeout_keep_alive_task is not None:
            since = self.timeout_keep_alive_task.when() - self.limits.keep_alive_timeout_s
        elif self.cycle is None and self._head_timer is not None:
            since = self._head_timer.when() - self.limits.header_timeout_s
        else:
            return None
        return since, self._number

    def _close_idlest(self) -> bool:
        """Close the connection idle longest to make room; False when none is idle."""
        # A scan, at the cap only, so that requests pay nothing for bookkeeping; after one that
        # finds none idle, a flood of connections is refused unscanned for a moment.
        server = type(self)
        now = self.loop.time()
        if now < server.scan_after:
            return False
        idlest: LimitedHttpProtocol | None = None
        idlest_since = (float("inf"), 0)
        for connection in self.connections:
            if connection is self or not isinstance(connection, LimitedHttpProtocol):
                continue
            since = connection._idle_since()
            if since is not None and since < idlest_since and not connection.transport.is_closing():
                idlest, idlest_since = connection, since
        if idlest is None:
            server.scan_after = now + _RESCAN_AFTER_S
            return False
        # Counted out now: its connection_lost comes on a later loop iteration.
        self.connections.discard(idlest)
        idlest.transport.close()
        return True

    def _note_refused_connection(self) -> None:
        # A warning at most every _WARN_EVERY_S: a flood of connections must not flood the log.
        server = type(self)
        server.refused_connections += 1
        now = self.loop.time()
        if now - server.warned_at >= _WARN_EVERY_S:
            logger.warning(
                "refused %d connection(s) since the last warning: %d open, none idle "
                "(max_connections)",
                server.refused_connections,
                len(self.connections) - 1,
            )
            server.refused_connections, server.warned_at = 0, now

    def _head_late(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A request pipelined behind one still answering: wait for that answer.
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_late)
            return
        if not self._head_started:
            self.transport.close()  # connected and silent: nothing to answer
            return
        self._refuse(408, f"request headers not received within {self.limits.header_timeout_s} s")

    def _body_late(self) -> None:
        self._body_timer = None
        if self._in_head or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused:
            self._body_read_at = now  # the application is not reading: not the client's pause
        paused_s = now - self._body_read_at
        if paused_s < self.limits.body_timeout_s:
            self._body_timer = self.loop.call_later(
                self.limits.body_timeout_s - paused_s, self._body_late
            )
            return
        logger.debug("closing a connection: no request body for %.0f s", paused_s)
        # The application is reading the body, so it owns the answer; it sees a disconnect.
        self.transport.close()

    def _refuse(self, status: int, message: str, extra_headers: bytes = b"") -> None:
        """Answer ``status`` and close, reading on a little so that the answer arrives."""
        logger.debug("answered %d: %s", status, message)
        self._refusal = (status, message)
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None
        body = orjson.dumps({"error": message})
        head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n".encode()]
        head += [
            name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers
        ]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n",
            extra_headers,
            b"\r\n",
            body,
        ]
        self.transport.write(b"".join(head))
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._linger = self.loop.call_later(_LINGER_S, self.transport.close)
        else:
            self.transport.close()
