"""Keep-alive HTTP/1.1 client connections over asyncio, answers parsed by httptools.

Two users make the same kind of request many times over: the activator's upstream pool
(``activator.upstream``: a client's request to a worker) and ``zeroserve bench``'s load
(``zeroserve.bench.client``). Each has the request's bytes ready, sends one request at a time
on a connection kept open, and needs the answer's status, its body as it comes, and whether
the connection may carry the next request. That is what :class:`Http1Connection` does: a
request is one ``transport.write`` of bytes joined beforehand (two for a large body, which is
then not copied), and the answer is parsed in C as it arrives and handed, event by event, to
the :class:`Receiver` the request was written with. No task, future or stream object is made
per request here, so each user pays only for what it keeps: the pool one future per answer
to await, the load generator none.

Pools, timeouts and retries are the users' own policies, not this module's.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Final, Protocol, cast

import httptools

_SEPARATE_WRITE_BYTES: Final = 1 << 16
"""Bodies from this size are written after the head rather than joined to it (no copy)."""


class Failure(enum.Enum):
    """Why an answer did not arrive whole."""

    PROTOCOL = "protocol"
    """The server sent bytes the HTTP/1.1 parser refuses."""
    CLOSED_BEFORE_ANSWER = "closed_before_answer"
    """The connection closed or was reset before any byte of the answer came: on a
    connection that carried earlier requests, the server may have timed it out as idle
    just as the request went out."""
    CLOSED_DURING_ANSWER = "closed_during_answer"
    """The connection closed or was reset part way through the answer."""


class Receiver(Protocol):
    """What the connection tells about the answer to the request written with it.

    Exactly one of :meth:`answer_complete` or :meth:`answer_failed` ends each request; the
    connection has forgotten the receiver by then, so it may write the next request at once.
    """

    def answer_head(
        self, status: int, is_keep_alive: bool, headers: list[tuple[bytes, bytes]]
    ) -> None:
        """The status line and headers (names lower-cased) of the final answer (a 1xx
        interim answer is skipped). ``headers`` is empty unless the connection keeps them."""

    def answer_body(self, chunk: bytes) -> None:
        """A piece of the body, transfer encoding removed, content encoding kept."""

    def answer_complete(self) -> None:
        """The whole answer has arrived."""

    def answer_failed(self, failure: Failure, cause: Exception | None) -> None:
        """The answer will not arrive whole; ``cause`` is the parser's error or the
        transport's, where there was one."""


class Http1Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 client connection carrying at most one request at a time.

    Bytes that arrive while no request is in flight put the connection out of step: it is
    closed. So is a connection whose answer says ``Connection: close``, once that answer has
    arrived. Subclasses add their users' state and override :meth:`connection_closed`, called
    once the transport is gone, and may extend :meth:`close`.

    Parameters:
        keep_headers: hand each answer's headers to its receiver (otherwise the parser is
            not asked for them, which saves a callback per header).
    """

    def __init__(self, *, keep_headers: bool = False) -> None:
        self._keep_headers = keep_headers
        self._parser = self._new_parser(is_head=False)
        self._transport: asyncio.Transport | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        """The answer's headers so far; never filled unless headers are kept."""
        self._is_head = False
        self._is_informational = False
        self._is_keep_alive = False
        self._has_received = False
        self._drained: asyncio.Future[None] | None = None
        self._is_reading_paused = False
        self.receiver: Receiver | None = None
        """Whoever waits for the answer to the request in flight; None when idle."""
        self.is_closed = False
        """The transport is gone (:meth:`connection_lost` ran)."""

    # -- for the users ---------------------------------------------------------------------

    def write_request(
        self, receiver: Receiver, head: bytes, body: bytes = b"", *, is_head: bool = False
    ) -> None:
        """Send a request (``head`` ends with the blank line; ``body`` follows, if any) and
        tell ``receiver`` about its answer. ``is_head``: the request is a ``HEAD``, whose
        answer has no body whatever its headers say; httptools cannot be told so, so the
        answer ends at its head and the connection is not reused."""
        assert self._transport is not None
        self.receiver = receiver
        self._has_received = False
        if is_head:
            self._is_head = True
            self._parser = self._new_parser(is_head=True)
        if not body:
            self._transport.write(head)
        elif len(body) >= _SEPARATE_WRITE_BYTES:
            self._transport.write(head)
            self._transport.write(body)
        else:
            self._transport.write(head + body)

    @property
    def is_write_paused(self) -> bool:
        """The transport's write buffer is full: the server is not reading."""
        return self._drained is not None

    async def wait_drained(self) -> None:
        """Return once the write buffer has drained (or the connection is gone)."""
        if self._drained is not None:
            await asyncio.shield(self._drained)

    @property
    def is_reusable(self) -> bool:
        """Idle, open and not closing: it may carry the next request."""
        transport = self._transport
        return (
            self.receiver is None
            and not self.is_closed
            and transport is not None
            and not transport.is_closing()
        )

    def pause_reading(self) -> None:
        """Stop reading the socket (the receiver has buffered enough)."""
        if not self._is_reading_paused and self._transport is not None:
            self._is_reading_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._is_reading_paused and self._transport is not None and not self.is_closed:
            self._is_reading_paused = False
            self._transport.resume_reading()

    def close(self, *, abort: bool = False) -> None:
        """Close the connection (``abort``: at once, unsent data dropped). Idempotent; a
        request in flight fails when the transport is gone."""
        if self._transport is not None and not self.is_closed:
            if abort:
                self._transport.abort()
            else:
                self._transport.close()

    def connection_closed(self) -> None:
        """Called once the transport is gone, after a request in flight has been failed."""

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.receiver is None:
            self.close()
            return
        self._has_received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(Failure.PROTOCOL, exc)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_closed = True
        if self.receiver is not None:
            failure = (
                Failure.CLOSED_DURING_ANSWER if self._has_received else Failure.CLOSED_BEFORE_ANSWER
            )
            self._fail(failure, exc)
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self.connection_closed()

    def pause_writing(self) -> None:
        self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    # -- httptools callbacks (bound in _new_parser) ------------------------------------------

    def _new_parser(self, *, is_head: bool) -> httptools.HttpResponseParser:
        # httptools looks each callback up once, when the parser is made, and calls the bound
        # method it found: only the events this connection needs are asked for.
        callbacks = _Callbacks()
        if self._keep_headers:
            callbacks.on_header = self._on_header
        if is_head:
            callbacks.on_headers_complete = self._on_head_only_complete
            callbacks.on_message_complete = self._on_message_complete_after_head
        else:
            callbacks.on_headers_complete = self._on_headers_complete
            callbacks.on_body = self._on_body
            callbacks.on_message_complete = self._on_message_complete
        return httptools.HttpResponseParser(callbacks)

    def _on_header(self, name: bytes, value: bytes | None) -> None:
        if not self._is_informational:
            self._headers.append((name.lower(), value or b""))

    def _on_headers_complete(self) -> None:
        receiver = self.receiver
        if receiver is None:
            return
        status = self._parser.get_status_code()
        # A 1xx is followed by the real answer on the same connection.
        if 100 <= status < 200:
            self._is_informational = True
            self._headers.clear()
            return
        self._is_keep_alive = not self._is_head and self._parser.should_keep_alive()
        headers = self._headers
        if self._keep_headers:
            self._headers = []
        receiver.answer_head(status, self._is_keep_alive, headers)

    def _on_body(self, body: bytes) -> None:
        if self.receiver is not None:
            self.receiver.answer_body(body)

    def _on_message_complete(self) -> None:
        if self._is_informational:
            self._is_informational = False
            return
        receiver, self.receiver = self.receiver, None
        if not self._is_keep_alive:
            self.close()
        if receiver is not None:
            receiver.answer_complete()

    def _on_head_only_complete(self) -> None:
        self._on_headers_complete()
        if self._is_informational:
            return
        receiver, self.receiver = self.receiver, None
        self.close()
        if receiver is not None:
            receiver.answer_complete()

    def _on_message_complete_after_head(self) -> None:
        self._is_informational = False

    def _fail(self, failure: Failure, cause: Exception | None) -> None:
        receiver, self.receiver = self.receiver, None
        if receiver is not None:
            receiver.answer_failed(failure, cause)


class _Callbacks:
    """The parser's callbacks: httptools calls those of its attributes that are set."""

    __slots__ = ("on_body", "on_header", "on_headers_complete", "on_message_complete")

    on_header: object
    on_headers_complete: object
    on_body: object
    on_message_complete: object
