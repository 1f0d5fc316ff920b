"""Keep-alive HTTP/1.1 connections for the load, and plain blocking requests for setup.

A :class:`Connection` is an ``asyncio.Protocol`` carrying one request at a time: ``send``
writes pre-built request bytes, ``httptools`` parses the answer in C, and the owner (a
:class:`ResponseSink`: the closed or open loop) is called back once per answer. No task,
future or stream object is made per request: on a 2-core machine every microsecond the
client spends is a microsecond the server under test does not get. Bodies are not kept,
except the first bytes of error answers (to say why in the report).

Error kinds, as reported: ``http_<status>`` (an answer that is not 2xx), ``connect`` (no
connection), ``connection`` (closed or reset with a request in flight), ``timeout`` (no full
answer within the timeout) and ``protocol`` (not HTTP/1.1 the parser accepts).

A connection opened with a :class:`BodyObserver` (``--stream``) also hands it the raw body
chunks of each 2xx answer with their arrival time, as the parser yields them; the observer
is reset at each send.
"""

from __future__ import annotations

import asyncio
import http.client
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Protocol, cast
from urllib.parse import urlsplit

import httptools

ERROR_SAMPLE_BYTES: Final = 300
"""How much of an error answer's body is kept as a sample."""


class EndpointError(ValueError):
    """The URL is not one the client can load (``http://host[:port][/prefix]`` only)."""


@dataclass(frozen=True)
class Endpoint:
    """Where the server is: host, port and a path prefix (empty or ``/something``)."""

    host: str
    port: int
    base_path: str = ""

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http":
            raise EndpointError(f"only http:// URLs are supported, not {parts.scheme}://")
        if not parts.hostname:
            raise EndpointError(f"no host in {url!r}")
        try:
            port = parts.port or 80
        except ValueError:
            raise EndpointError(f"bad port in {url!r}") from None
        return cls(parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == 80 else f"{host}:{self.port}"


class ResponseSink(Protocol):
    """What a connection reports to: each answer, each failure, and its closing."""

    def on_response(self, connection: Connection, tag: int, status: int) -> None: ...

    def on_failure(self, connection: Connection, tag: int, kind: str) -> None: ...

    def on_closed(self, connection: Connection) -> None: ...


class BodyObserver(Protocol):
    """Sees the body of each 2xx answer, chunk by chunk, as it arrives."""

    def reset(self) -> None: ...

    def feed(self, data: bytes, at_ns: int) -> None: ...


class Connection(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight."""

    def __init__(self, sink: ResponseSink, observer: BodyObserver | None = None) -> None:
        self._sink = sink
        self.observer = observer
        """Fed the body chunks of 2xx answers (``perf_counter_ns`` arrival times)."""
        self._is_observed = False
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._status = 0
        self._error_body: bytearray | None = None
        self.error_sample: bytes = b""
        """The start of the last error answer's body."""
        self.tag = -1
        """The owner's id of the request in flight; -1 when idle."""
        self.sent_ns = 0
        """``perf_counter_ns`` when the request in flight was written."""
        self.is_closed = False

    # -- used by the loops ---------------------------------------------------------------

    def send(self, request: bytes, tag: int, now_ns: int = 0) -> None:
        """Write ``request``; ``now_ns`` (``perf_counter_ns``) saves a clock read when the
        caller has just taken one."""
        assert self._transport is not None
        self.tag = tag
        self.sent_ns = now_ns or time.perf_counter_ns()
        if self.observer is not None:
            self.observer.reset()
        self._transport.write(request)

    def abort(self, kind: str) -> None:
        """Give up on the request in flight (counted as ``kind``) and drop the connection."""
        tag, self.tag = self.tag, -1
        if tag >= 0:
            self._sink.on_failure(self, tag, kind)
        self.close(abort=True)

    def close(self, *, abort: bool = False) -> None:
        if self._transport is not None and not self.is_closed:
            if abort:
                self._transport.abort()
            else:
                self._transport.close()

    @property
    def is_busy(self) -> bool:
        return self.tag >= 0

    @property
    def is_reusable(self) -> bool:
        """Open, not closing (an answer without keep-alive closes it), and idle."""
        transport = self._transport
        return (
            self.tag < 0
            and not self.is_closed
            and transport is not None
            and not transport.is_closing()
        )

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.tag < 0:
            # Nothing asked: the server may say why it closes an idle connection; the
            # connection is out of step either way.
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self.abort("protocol")

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_closed = True
        tag, self.tag = self.tag, -1
        if tag >= 0:
            self._sink.on_failure(self, tag, "connection")
        self._sink.on_closed(self)

    # -- httptools callbacks -------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._error_body = bytearray() if self._status >= 300 else None
        self._is_observed = self.observer is not None and 200 <= self._status < 300

    def on_body(self, body: bytes) -> None:
        if self._is_observed:
            assert self.observer is not None
            self.observer.feed(body, time.perf_counter_ns())
            return
        if self._error_body is not None and len(self._error_body) < ERROR_SAMPLE_BYTES:
            self._error_body += body[: ERROR_SAMPLE_BYTES - len(self._error_body)]

    def on_message_complete(self) -> None:
        status = self._status
        if 100 <= status < 200:
            # An informational answer; the real one follows on the same connection.
            return
        if self._error_body is not None:
            self.error_sample = bytes(self._error_body)
            self._error_body = None
        keep_alive = self._parser.should_keep_alive()
        tag, self.tag = self.tag, -1
        if not keep_alive:
            # Closed before the owner may reuse it; on_closed tells the owner it is gone.
            self.close()
        self._sink.on_response(self, tag, status)


async def abort_overdue(connections: Iterable[Connection], timeout_s: float) -> None:
    """A load run's watchdog: for ever, abort (as ``timeout``) every connection whose request
    has waited longer than ``timeout_s``; cancelled by :func:`close_all`."""
    timeout_ns = int(timeout_s * 1e9)
    tick_s = min(0.1, timeout_s / 4)
    while True:
        await asyncio.sleep(tick_s)
        now = time.perf_counter_ns()
        for connection in list(connections):
            if connection.is_busy and now - connection.sent_ns > timeout_ns:
                connection.abort("timeout")


async def close_all(
    watchdog: asyncio.Task[None],
    tasks: Iterable[asyncio.Task[None]],
    connections: Iterable[Connection],
) -> None:
    """End a load run: cancel its watchdog and tasks, wait for them, abort every connection."""
    watchdog.cancel()
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(watchdog, *tasks, return_exceptions=True)
    for connection in list(connections):
        connection.close(abort=True)
    # Let the transports close before the loop is torn down.
    await asyncio.sleep(0)


async def open_connection(
    endpoint: Endpoint,
    sink: ResponseSink,
    timeout_s: float,
    observer: BodyObserver | None = None,
) -> Connection:
    """A new connection to ``endpoint``; raises ``OSError`` or ``TimeoutError``."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout_s):
        _, connection = await loop.create_connection(
            lambda: Connection(sink, observer), endpoint.host, endpoint.port
        )
    return connection


@dataclass(frozen=True)
class SetupAnswer:
    """An answer to a setup request: status, lower-cased headers, body."""

    status: int
    headers: dict[str, str]
    body: bytes


def fetch(
    endpoint: Endpoint,
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float,
) -> SetupAnswer:
    """One blocking request on its own connection, for metadata and checks before the load
    (never on the timed path). Raises ``OSError`` when the server cannot be reached."""
    connection = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout_s)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        payload = response.read()
        return SetupAnswer(
            response.status, {k.lower(): v for k, v in response.getheaders()}, payload
        )
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP answer from {endpoint.host}:{endpoint.port}: {exc!r}") from exc
    finally:
        connection.close()
