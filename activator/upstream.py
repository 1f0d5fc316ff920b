"""The activator's connections to workers: a pool of keep-alive HTTP/1.1 connections.

Why not a general-purpose client: the activator makes one kind of request (a body already
in memory, to a worker on the cluster network) on the path of every inference, and
profiles of httpx/httpcore there showed 1-1.5 ms of CPU per request, most of it in layers
this hop does not need (URL models, header classes, anyio streams, a pool scanned on every
request). The connections are :mod:`foundation.http1_client`'s: a request is one
``transport.write`` of pre-joined bytes and a response is parsed in ``data_received`` as it
arrives, so a small answer costs one parser call. This module adds what the activator needs
on top: an awaitable answer whose body streams with flow control, timeouts, and the pool.

The pool keeps idle connections per worker URL (most recently used first) under one bound on
open connections; a caller that finds the bound reached waits up to the pool timeout.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from foundation.http1_client import Failure, Http1Connection

logger = logging.getLogger(__name__)

_HIGH_WATER_BYTES = 1 << 20
"""Body bytes buffered for a slow reader before the worker's socket stops being read."""
_LOW_WATER_BYTES = 1 << 18
"""Buffered bytes under which reading resumes."""
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
"""Methods sent without ``Content-Length`` when their body is empty, as browsers do."""


class UpstreamConnectError(Exception):
    """The connection could not be opened: the worker never saw the request."""


class UpstreamPoolTimeoutError(Exception):
    """No connection came free within the pool timeout."""


class UpstreamReadTimeoutError(Exception):
    """The worker sent nothing for the read timeout after the request (or the last bytes)."""


class UpstreamProtocolError(Exception):
    """The worker closed, reset or garbled the connection after the request was sent."""


class _StaleConnectionError(Exception):
    """A reused connection closed before any answer: the worker may have timed it out."""


@dataclass(frozen=True, slots=True)
class UpstreamTimeouts:
    """Every wait on a worker, in seconds."""

    connect_s: float
    read_s: float
    """Until the answer's head, and between two pieces of its body."""
    write_s: float
    """For the request to leave the socket buffer while the worker is not reading."""
    pool_s: float


class UpstreamResponse:
    """A worker's answer: status and headers when returned, then the body as it arrives.

    Whoever gets one must call :meth:`close` once done with it, whatever happened: that
    returns the connection to the pool when the answer was read to its end, or closes it.
    """

    __slots__ = (
        "_buffered",
        "_chunks",
        "_connection",
        "_error",
        "_head",
        "_waiter",
        "headers",
        "is_complete",
        "keep_alive",
        "status",
    )

    def __init__(self, connection: _Connection) -> None:
        self._connection: _Connection | None = connection
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        """Header names lower-cased, values as sent, in the worker's order."""
        self.is_complete = False
        """The whole body has arrived (it may still be buffered here)."""
        self.keep_alive = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._error: Exception | None = None
        self._head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter: asyncio.Future[None] | None = None

    def take_buffered(self) -> bytes:
        """Every body byte received and not yet taken, at once."""
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        self._resume_if_drained()
        return data

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, piece by piece as the worker sends it (transfer encoding removed,
        content encoding kept).

        Raises:
            UpstreamProtocolError: the connection broke before the body's end.
            UpstreamReadTimeoutError: nothing arrived for the read timeout.
        """
        loop = asyncio.get_running_loop()
        while True:
            if self._chunks:
                yield self.take_buffered()
                continue
            if self._error is not None:
                raise self._error
            if self.is_complete:
                return
            connection = self._connection
            read_s = connection.timeouts.read_s if connection else 0.0
            self._waiter = loop.create_future()
            try:
                await asyncio.wait_for(self._waiter, read_s)
            except TimeoutError:
                self._fail(UpstreamReadTimeoutError(f"no bytes for {read_s:g} s"))
            finally:
                self._waiter = None

    def close(self) -> None:
        """Give the connection back (answer read to its end) or close it. Idempotent."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        reusable = self.is_complete and self.keep_alive and self._error is None
        connection.finish(reusable=reusable)

    # -- foundation.http1_client.Receiver ----------------------------------------------------

    def answer_head(
        self, status: int, is_keep_alive: bool, headers: list[tuple[bytes, bytes]]
    ) -> None:
        self.status = status
        self.keep_alive = is_keep_alive
        self.headers = headers
        if not self._head.done():
            self._head.set_result(None)

    def answer_body(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered > _HIGH_WATER_BYTES and self._connection is not None:
            self._connection.pause_reading()
        self._wake()

    def answer_complete(self) -> None:
        self.is_complete = True
        self._wake()

    def answer_failed(self, failure: Failure, cause: Exception | None) -> None:
        connection = self._connection
        if failure is Failure.PROTOCOL:
            self._fail(UpstreamProtocolError(f"invalid HTTP from worker: {cause}"))
        elif failure is Failure.CLOSED_BEFORE_ANSWER and connection and connection.was_used:
            self._fail(_StaleConnectionError())
        else:
            reason = f"connection lost: {cause!r}" if cause else "connection closed"
            self._fail(UpstreamProtocolError(reason))

    # -- internals -------------------------------------------------------------------------

    async def _wait_head(self, timeout_s: float) -> None:
        if not self._head.done():
            try:
                await asyncio.wait_for(self._head, timeout_s)
            except TimeoutError:
                raise UpstreamReadTimeoutError(f"no answer within {timeout_s:g} s") from None
        self._head.result()

    def _resume_if_drained(self) -> None:
        if self._buffered < _LOW_WATER_BYTES and self._connection is not None:
            self._connection.resume_reading()

    def _fail(self, error: Exception) -> None:
        if self._error is None and not self.is_complete:
            self._error = error
        if not self._head.done():
            self._head.set_exception(error)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Connection(Http1Connection):
    """A connection to one worker, kept by the pool between requests."""

    def __init__(self, pool: UpstreamPool, url: str, timeouts: UpstreamTimeouts) -> None:
        super().__init__(keep_headers=True)
        self._pool = pool
        self.url = url
        self.timeouts = timeouts
        self.idle_since = 0.0
        self.was_used = False
        """It carried an answer before: a close before the next answer may be the worker's
        idle timeout, and the request is worth one retry."""

    async def send(self, head: bytes, body: bytes, *, is_head: bool) -> UpstreamResponse:
        response = UpstreamResponse(self)
        self.write_request(response, head, body, is_head=is_head)
        if self.is_write_paused:
            try:
                await asyncio.wait_for(self.wait_drained(), self.timeouts.write_s)
            except TimeoutError:
                response.close()
                raise UpstreamProtocolError(
                    f"request not sent within {self.timeouts.write_s:g} s"
                ) from None
        try:
            await response._wait_head(self.timeouts.read_s)
        except BaseException:
            response.close()
            raise
        return response

    def finish(self, *, reusable: bool) -> None:
        """The response is done with: back to the pool's idle connections, or closed."""
        # Whatever of the answer still comes is nobody's: the connection is out of step.
        self.receiver = None
        self.resume_reading()
        if reusable and self.is_reusable:
            self.was_used = True
            self.idle_since = time.monotonic()
            self._pool._put_idle(self)
        else:
            self.close()

    def abort(self, error: Exception) -> None:
        """Fail the answer in progress, if any, and close."""
        if isinstance(self.receiver, UpstreamResponse):
            self.receiver._fail(error)
        self.finish(reusable=False)

    def close(self, *, abort: bool = False) -> None:
        super().close(abort=abort)
        # The slot is free now, not only once the transport has finished closing.
        self._pool._forget(self)

    def connection_closed(self) -> None:
        self._pool._forget(self)


class UpstreamPool:
    """Keep-alive connections to every worker, bounded in number.

    Parameters:
        timeouts: every wait on a worker.
        max_connections: open connections to all workers together (busy and idle).
        max_idle_connections: idle ones kept for reuse; beyond it the oldest is closed.
        idle_expiry_s: an idle connection older than this is closed instead of reused
            (keep it below the workers' keep-alive timeout, so that a request never races
            the worker closing the connection).
    """

    def __init__(
        self,
        timeouts: UpstreamTimeouts,
        *,
        max_connections: int,
        max_idle_connections: int,
        idle_expiry_s: float,
    ) -> None:
        self._timeouts = timeouts
        self._max_connections = max_connections
        self._max_idle = max_idle_connections
        self._idle_expiry_s = idle_expiry_s
        self._idle: dict[str, list[_Connection]] = {}
        self._idle_count = 0
        self._open: set[_Connection] = set()
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._addresses: dict[str, tuple[str, int, bytes]] = {}
        self._is_closed = False

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def request(
        self,
        url: str,
        method: str,
        target: str,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
    ) -> UpstreamResponse:
        """Send one request to the worker at ``url`` (``http://host:port``) and return its
        answer once its head has arrived; see :class:`UpstreamResponse`.

        ``headers`` go as given, after ``Host``; ``Content-Length`` is added for the body.

        Raises:
            UpstreamConnectError: no connection could be opened (the worker never saw it).
            UpstreamPoolTimeoutError: every connection stayed busy for the pool timeout.
            UpstreamReadTimeoutError: no answer within the read timeout.
            UpstreamProtocolError: the worker failed after the request was sent.
        """
        host, port, authority = self._address(url)
        lines = [f"{method} {target} HTTP/1.1\r\nhost: ".encode("latin-1"), authority, b"\r\n"]
        for name, value in headers:
            lines += (name, b": ", value, b"\r\n")
        if body or method not in _NO_BODY_METHODS:
            lines.append(b"content-length: %d\r\n" % len(body))
        lines.append(b"\r\n")
        head = b"".join(lines)
        is_head = method == "HEAD"
        connection = self._take_idle(url)
        if connection is not None:
            try:
                return await connection.send(head, body, is_head=is_head)
            except _StaleConnectionError:
                logger.debug("idle connection to %s was closed by the worker; reconnecting", url)
        connection = await self._connect(url, host, port)
        return await connection.send(head, body, is_head=is_head)

    async def aclose(self) -> None:
        """Close every connection and fail whoever waits for one."""
        self._is_closed = True
        for connection in list(self._open):
            connection.abort(UpstreamProtocolError("connection pool closed"))
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_exception(UpstreamConnectError("connection pool closed"))
        # Let the transports run their close callbacks before the loop goes away.
        await asyncio.sleep(0)

    def _address(self, url: str) -> tuple[str, int, bytes]:
        address = self._addresses.get(url)
        if address is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise UpstreamConnectError(f"not an http:// worker URL: {url!r}")
            port = parts.port or 80
            address = (parts.hostname, port, parts.netloc.encode("latin-1"))
            if len(self._addresses) >= 4 * self._max_connections:
                self._addresses.clear()
            self._addresses[url] = address
        return address

    def _take_idle(self, url: str) -> _Connection | None:
        idle = self._idle.get(url)
        if not idle:
            return None
        expired_before = time.monotonic() - self._idle_expiry_s
        while idle:
            connection = idle.pop()
            self._idle_count -= 1
            if connection.idle_since >= expired_before and not connection.is_closed:
                return connection
            connection.finish(reusable=False)
        return None

    async def _connect(self, url: str, host: str, port: int) -> _Connection:
        if self._is_closed:
            raise UpstreamConnectError("connection pool closed")
        await self._acquire_slot()
        loop = asyncio.get_running_loop()
        connection = _Connection(self, url, self._timeouts)
        self._open.add(connection)
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: connection, host, port),
                self._timeouts.connect_s,
            )
        except (OSError, TimeoutError) as exc:
            self._forget(connection)
            raise UpstreamConnectError(f"cannot connect to {url}: {exc!r}") from exc
        except BaseException:
            self._forget(connection)
            raise
        return connection

    async def _acquire_slot(self) -> None:
        deadline = asyncio.get_running_loop().time() + self._timeouts.pool_s
        while len(self._open) >= self._max_connections:
            if self._idle_count:
                # Room for a new worker's connection: close the oldest idle one elsewhere.
                self._close_oldest_idle()
                continue
            waiter = asyncio.get_running_loop().create_future()
            self._slot_waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except TimeoutError:
                raise UpstreamPoolTimeoutError(
                    f"all {self._max_connections} connections busy for {self._timeouts.pool_s:g} s"
                ) from None
            finally:
                with contextlib.suppress(ValueError):
                    self._slot_waiters.remove(waiter)

    def _put_idle(self, connection: _Connection) -> None:
        if self._is_closed or self._slot_waiters:
            # Someone waits for a slot (perhaps for another worker): free this one for them.
            connection.finish(reusable=False)
            return
        self._idle.setdefault(connection.url, []).append(connection)
        self._idle_count += 1
        if self._idle_count > self._max_idle:
            self._close_oldest_idle()

    def _close_oldest_idle(self) -> None:
        oldest: _Connection | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest.idle_since):
                oldest = idle[0]
        if oldest is not None:
            self._remove_idle(oldest)
            oldest.finish(reusable=False)

    def _remove_idle(self, connection: _Connection) -> None:
        idle = self._idle.get(connection.url)
        if idle and connection in idle:
            idle.remove(connection)
            self._idle_count -= 1
            if not idle:
                del self._idle[connection.url]

    def _forget(self, connection: _Connection) -> None:
        """``connection`` is closed or closing: its slot is free."""
        if connection not in self._open:
            return
        self._open.discard(connection)
        self._remove_idle(connection)
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break
