"""Keep-alive HTTP/1.1 connections for the load, and plain blocking requests for setup.

A :class:`Connection` (a :class:`foundation.http1_client.Http1Connection`, the connection the
activator's upstream pool uses too) carries one request at a time: ``send`` writes pre-built
request bytes, ``httptools`` parses the answer in C, and the owner (a :class:`ResponseSink`:
the closed or open loop) is called back once per answer. No task,
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
from typing import Final, Protocol
from urllib.parse import urlsplit

from foundation.http1_client import Failure, Http1Connection

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


class Connection(Http1Connection):
    """One keep-alive connection with at most one request in flight; it receives its own
    answers (:class:`foundation.http1_client.Receiver`) and reports them to its sink."""

    def __init__(
        self, sink: ResponseSink, observer: BodyObserver | None = None, slot: int = 0
    ) -> None:
        super().__init__()
        self._sink = sink
        self.observer = observer
        """Fed the body chunks of 2xx answers (``perf_counter_ns`` arrival times)."""
        self._is_observed = False
        self._status = 0
        self._error_body: bytearray | None = None
        self.error_sample: bytes = b""
        """The start of the last error answer's body."""
        self.tag = -1
        """The owner's id of the request in flight; -1 when idle."""
        self.slot = slot
        """The owner's slot this connection fills (which of the plan's per-slot requests
        it sends)."""
        self.sent_ns = 0
        """``perf_counter_ns`` when the request in flight was written."""

    # -- used by the loops ---------------------------------------------------------------

    def send(self, request: bytes, tag: int, now_ns: int = 0) -> None:
        """Write ``request``; ``now_ns`` (``perf_counter_ns``) saves a clock read when the
        caller has just taken one."""
        self.tag = tag
        self.sent_ns = now_ns or time.perf_counter_ns()
        if self.observer is not None:
            self.observer.reset()
        self.write_request(self, request)

    def give_up(self, kind: str) -> None:
        """Give up on the request in flight (counted as ``kind``) and drop the connection."""
        self.receiver = None
        tag, self.tag = self.tag, -1
        if tag >= 0:
            self._sink.on_failure(self, tag, kind)
        self.close(abort=True)

    @property
    def is_busy(self) -> bool:
        return self.tag >= 0

    # -- foundation.http1_client.Receiver ------------------------------------------------

    def answer_head(
        self, status: int, is_keep_alive: bool, headers: list[tuple[bytes, bytes]]
    ) -> None:
        self._status = status
        self._error_body = bytearray() if status >= 300 else None
        self._is_observed = self.observer is not None and 200 <= status < 300

    def answer_body(self, chunk: bytes) -> None:
        if self._is_observed:
            assert self.observer is not None
            self.observer.feed(chunk, time.perf_counter_ns())
            return
        if self._error_body is not None and len(self._error_body) < ERROR_SAMPLE_BYTES:
            self._error_body += chunk[: ERROR_SAMPLE_BYTES - len(self._error_body)]

    def answer_complete(self) -> None:
        if self._error_body is not None:
            self.error_sample = bytes(self._error_body)
            self._error_body = None
        tag, self.tag = self.tag, -1
        # An answer without keep-alive has closed the connection: on_closed tells the owner.
        self._sink.on_response(self, tag, self._status)

    def answer_failed(self, failure: Failure, cause: Exception | None) -> None:
        tag, self.tag = self.tag, -1
        if tag >= 0:
            kind = "protocol" if failure is Failure.PROTOCOL else "connection"
            self._sink.on_failure(self, tag, kind)

    def connection_closed(self) -> None:
        self._sink.on_closed(self)


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
                connection.give_up("timeout")


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
    slot: int = 0,
) -> Connection:
    """A new connection to ``endpoint`` filling the owner's ``slot``; raises ``OSError`` or
    ``TimeoutError``."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout_s):
        _, connection = await loop.create_connection(
            lambda: Connection(sink, observer, slot), endpoint.host, endpoint.port
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
    except http.client.BadStatusLine as exc:
        line = str(exc.args[0]) if exc.args else ""
        if line.startswith("\x00\x00"):
            # An HTTP/2 frame (a SETTINGS frame) where an HTTP/1.1 status line should be.
            raise OSError(
                f"{endpoint.host}:{endpoint.port} answered HTTP/2, not HTTP/1.1: a gRPC port? "
                "(--protocol grpc)"
            ) from exc
        raise OSError(
            f"bad HTTP answer from {endpoint.host}:{endpoint.port}: {line[:80]!r}"
        ) from exc
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP answer from {endpoint.host}:{endpoint.port}: {exc!r}") from exc
    finally:
        connection.close()
