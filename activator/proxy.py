"""Forwarding one request to a replica, and streaming the answer back untouched.

:class:`Proxy` picks a replica (least outstanding requests; for a request of a sequence,
the replica its sequence runs on: :mod:`activator.sequences`) or, with none ready, waits in
the model's buffer; then it sends the request over the upstream pool
(:mod:`activator.upstream`) and streams the worker's bytes back as they come. Bodies and
headers pass through byte for byte, minus hop-by-hop headers. A replica that refused the
connection never saw the request, so the request goes to another replica or back to the
buffer; a failure after sending is the caller's 502, a worker that took too long its 504.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from functools import partial
from typing import Final
from urllib.parse import quote

import anyio
import orjson
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from activator.access_log import note_activation_wait
from activator.buffer import Buffer, Grant
from activator.errors import UpstreamBusyError, UpstreamError, UpstreamTimeoutError
from activator.http_errors import CLIENT_CLOSED
from activator.lb import Replica, choose_for_key
from activator.placements import PlacementView, ReplicaTable
from activator.sequences import SequenceBindings, SequenceLostError, SequenceTag, sequence_tag
from activator.traffic import Traffic
from activator.upstream import (
    UpstreamConnectError,
    UpstreamPool,
    UpstreamPoolTimeoutError,
    UpstreamProtocolError,
    UpstreamReadTimeoutError,
    UpstreamResponse,
)
from foundation.errors import ZeroserveError

logger = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
"""Headers that describe one connection, not the message (RFC 9110 section 7.6.1)."""

_NOT_FORWARDED = _HOP_BY_HOP | {b"host", b"expect", b"content-length", b"authorization"}
"""Also kept from the worker: ``Host`` names the activator, the activator's server has
already answered ``Expect: 100-continue``, the pool writes the body's length itself, and
the caller's API key is the activator's to check (a worker never sees, or logs, it)."""


_WHOLE_ANSWER_MAX_BYTES = 1 << 20
"""Answers up to this size are read whole from the worker before their head is passed on."""


UPSTREAM_FAILURES: Final = (
    UpstreamPoolTimeoutError,
    UpstreamReadTimeoutError,
    UpstreamProtocolError,
)
"""How a request to a worker fails once it could have a connection (see
:func:`upstream_failure`); a connection that could not be opened is not among them."""


def upstream_failure(
    error: Exception, *, model: str, url: str, timeout_s: float, retry_after_s: int
) -> ZeroserveError:
    """What the client gets for ``error`` (one of :data:`UPSTREAM_FAILURES`) on a request
    to the worker at ``url``: every connection busy is 503 (with ``retry_after_s``), no
    answer within ``timeout_s`` 504, a connection the worker broke 502. The HTTP proxy and
    the gRPC-Web hop answer alike."""
    if isinstance(error, UpstreamPoolTimeoutError):
        return UpstreamBusyError(model=model, retry_after_s=retry_after_s)
    if isinstance(error, UpstreamReadTimeoutError):
        return UpstreamTimeoutError(model=model, url=url, timeout_s=timeout_s)
    return UpstreamError(model=model, url=url, reason=str(error) or type(error).__name__)


class _NotSentError(Exception):
    """The connection to the replica failed, so the worker never saw the request."""


class Proxy:
    """Sends requests to replicas and streams their answers back.

    Parameters:
        pool: the one connection pool to every worker.
        table: the ready replicas, to choose from.
        view: told to forget a replica that refused a connection.
        buffer: where requests wait while a model has no ready replica.
        traffic: counts each request from arrival to the end of its answer.
        read_timeout_s: the pool's read timeout, named in 504 answers.
        activation_timeout_s: how long a request may wait in the buffer in all.
        retry_after_s: carried by the 503 for a full connection pool.
        sequences: where the requests of sequence models stick to their replica (see
            :mod:`activator.sequences`); None routes them as any other request.
    """

    def __init__(
        self,
        pool: UpstreamPool,
        table: ReplicaTable,
        view: PlacementView,
        buffer: Buffer,
        traffic: Traffic,
        *,
        read_timeout_s: float,
        activation_timeout_s: float,
        retry_after_s: int,
        sequences: SequenceBindings | None = None,
    ) -> None:
        self._pool = pool
        self._table = table
        self._view = view
        self._buffer = buffer
        self._traffic = traffic
        self._read_timeout_s = read_timeout_s
        self._activation_timeout_s = activation_timeout_s
        self._retry_after_s = retry_after_s
        self._sequences = sequences

    def would_activate(self, model: str) -> bool:
        """Whether a request for ``model`` now would start an activation."""
        return self._buffer.would_activate(model)

    async def forward(
        self, model: str, scope: Scope, receive: Receive, body: bytes
    ) -> StreamingResponse | Response:
        """Send the request in ``scope`` with ``body`` to a replica of ``model``.

        The returned response streams the worker's answer; when it is done (or the client
        leaves) the upstream connection, the replica's count and the traffic count are
        given back. ``receive`` is watched while the request waits in the buffer: a client
        that leaves then gives its place up, and gets a 499 nobody will read.

        Raises:
            ZeroserveError: the buffer's errors (429/503), or the upstream's (502/503/504).
        """
        self._traffic.begin(model)
        try:
            response = await self._dispatch(model, scope, receive, body)
        except BaseException:
            self._traffic.end(model)
            raise
        if response is None:
            self._traffic.end(model)
            return Response(status_code=CLIENT_CLOSED)
        return response

    async def _dispatch(
        self, model: str, scope: Scope, receive: Receive, body: bytes
    ) -> StreamingResponse | None:
        method: str = scope["method"]
        target = _target(scope)
        headers = _request_headers(scope["headers"])
        deadline: float | None = None
        is_retry = False
        loop = asyncio.get_running_loop()
        tag = self._sequence_tag(scope, body)
        while True:
            grant: Grant | None = None
            if tag is not None:
                replica = self._sequence_replica(model, tag)
            else:
                # While the model has a queue, new requests join it rather than overtake it.
                replica = None if self._buffer.is_waiting(model) else self._table.choose(model)
            if replica is None:
                if deadline is None:
                    deadline = loop.time() + self._activation_timeout_s
                waiting_since = loop.time()
                try:
                    grant = await self._wait_in_buffer(model, receive, deadline, is_retry)
                finally:
                    note_activation_wait(loop.time() - waiting_since)
                if grant is None:
                    return None
                replica = grant.replica
            replica.in_flight += 1
            if not replica.awaiting_head:
                replica.progress_at = loop.time()
            replica.awaiting_head += 1
            try:
                upstream, read_ahead = await self._send(
                    model, replica, method, target, headers, body
                )
            except _NotSentError:
                replica.awaiting_head -= 1
                replica.in_flight -= 1
                # Forget first, so that giving the grant back cannot hand the same dead
                # replica to the next waiter.
                self._view.forget(model, replica)
                if grant is not None:
                    grant.release()
                is_retry = True
                continue
            except BaseException:
                replica.awaiting_head -= 1
                replica.in_flight -= 1
                if grant is not None:
                    grant.release()
                raise
            replica.awaiting_head -= 1
            replica.progress_at = loop.time()
            if tag is not None:
                self._sequence_sent(model, tag, replica)
            if grant is not None:
                waited_s = grant.responded()
                if waited_s is not None:
                    self._traffic.first_response(model, replica.worker_id, waited_s)
            return _UpstreamResponse(
                upstream,
                read_ahead,
                replica.url + target,
                partial(self._finish, model, replica, grant, upstream),
            )

    def _sequence_tag(self, scope: Scope, body: bytes) -> SequenceTag | None:
        """The sequence an infer request belongs to, when sequences are routed by ID."""
        if self._sequences is None or not scope["path"].endswith("/infer"):
            return None
        header_length = None
        for name, value in scope["headers"]:
            if name == b"inference-header-content-length":
                header_length = int(value) if value.isdigit() else None
                break
        return sequence_tag(body, header_length)

    def _sequence_replica(self, model: str, tag: SequenceTag) -> Replica | None:
        """The replica a sequence's request goes to: the one it is bound to, else the one
        its ID hashes to; None when the model has none (the request waits in the buffer).

        Raises SequenceLostError when the sequence is bound to a worker that no longer
        serves the model and the request does not start the sequence again.
        """
        assert self._sequences is not None
        worker_id = self._sequences.worker_of(model, tag.correlation_id)
        if worker_id is not None:
            replica = self._table.get(model, worker_id)
            if replica is not None:
                return replica
            self._sequences.unbind(model, tag.correlation_id)
            if not tag.is_start:
                raise SequenceLostError(
                    model=model, correlation_id=tag.correlation_id, worker_id=worker_id
                )
        return choose_for_key(self._table.replicas(model), tag.correlation_id)

    def _sequence_sent(self, model: str, tag: SequenceTag, replica: Replica) -> None:
        """A sequence's request reached ``replica``: bind the sequence there (or mark the
        binding used), or forget it at END."""
        assert self._sequences is not None
        if tag.is_end:
            self._sequences.unbind(model, tag.correlation_id)
        else:
            self._sequences.bind(model, tag.correlation_id, replica.worker_id)

    async def _wait_in_buffer(
        self, model: str, receive: Receive, deadline: float, requeue: bool
    ) -> Grant | None:
        """A grant from the buffer, or None if the client disconnected first."""
        waiting = asyncio.ensure_future(
            self._buffer.wait(model, deadline=deadline, requeue=requeue)
        )
        left = asyncio.ensure_future(_client_left(receive))
        try:
            await asyncio.wait((waiting, left), return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Cancelling a wait that was granted meanwhile passes the grant on (buffer.wait).
            waiting.cancel()
            left.cancel()
            await asyncio.gather(waiting, left, return_exceptions=True)
        if left.cancelled():
            return waiting.result()
        logger.debug("client left while %s was starting", model)
        if not waiting.cancelled() and waiting.exception() is None:
            waiting.result().release()
        return None

    async def _send(
        self,
        model: str,
        replica: Replica,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> tuple[UpstreamResponse, bytes | None]:
        """The worker's answer, and its whole body when that was read ahead of passing the
        head on (see :func:`_read_to_end`).

        Raises:
            _NotSentError: the worker never saw the request.
            ZeroserveError: 503 for a full pool, 504 for a silent worker, 502 for a broken one.
        """
        # Only the client's headers go upstream (no defaults such as Accept-Encoding added),
        # or a worker would compress answers for callers that never asked for it.
        try:
            upstream = await self._pool.request(replica.url, method, target, headers, body)
            if not upstream.is_complete and _is_small(upstream.headers):
                return upstream, await _read_to_end(upstream)
            return upstream, None
        except UpstreamConnectError as exc:
            raise _NotSentError from exc
        except UPSTREAM_FAILURES as exc:
            raise upstream_failure(
                exc,
                model=model,
                url=replica.url,
                timeout_s=self._read_timeout_s,
                retry_after_s=self._retry_after_s,
            ) from exc

    async def _finish(
        self, model: str, replica: Replica, grant: Grant | None, upstream: UpstreamResponse
    ) -> None:
        try:
            upstream.close()
        finally:
            replica.in_flight -= 1
            if grant is not None:
                grant.release()
            self._traffic.end(model)


class _UpstreamResponse(StreamingResponse):
    """The worker's status, headers and raw (still encoded) body, streamed as they come."""

    def __init__(
        self,
        upstream: UpstreamResponse,
        read_ahead: bytes | None,
        url: str,
        on_close: Callable[[], Awaitable[None]],
    ) -> None:
        body: AsyncIterator[bytes] = upstream.chunks()
        headers = dict(upstream.headers)
        is_event_stream = headers.get(b"content-type", b"").startswith(b"text/event-stream")
        if is_event_stream and b"content-encoding" not in headers:
            body = _sse_with_error_event(body, url)
        super().__init__(body, status_code=upstream.status)
        self.raw_headers = [(k, v) for k, v in upstream.headers if k not in _HOP_BY_HOP]
        # A body of known length is already computed when its headers arrive; one without
        # (chunked, an event stream) may run for minutes and must stop when the client
        # leaves. Only the latter pays for Starlette's disconnect watcher (a task group).
        self._is_open_ended = is_event_stream or b"content-length" not in headers
        self._upstream = upstream
        self._read_ahead = read_ahead
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if self._is_open_ended:
                await super().__call__(scope, receive, send)
            elif self._upstream.is_complete:
                # The usual case: the whole answer came with its head, one message out.
                start = {"type": "http.response.start", "status": self.status_code}
                await send(start | {"headers": self.raw_headers})
                body = self._read_ahead
                if body is None:
                    body = self._upstream.take_buffered()
                await send({"type": "http.response.body", "body": body})
            else:
                await self.stream_response(send)
        finally:
            # Not a BackgroundTask: Starlette skips those when the stream fails or the client
            # leaves, and the connection, the replica's count and the buffer slot must come
            # back whatever happened. Shielded, since a client that left cancels us.
            with anyio.CancelScope(shield=True):
                await self._on_close()


async def _read_to_end(upstream: UpstreamResponse) -> bytes:
    """Wait for the rest of a small answer whose head came first, before anything goes to
    the client: if the worker dies between its head and its body (a worker killed under
    traffic does), the client gets a clear 502 instead of a connection cut after a 200."""
    try:
        return b"".join([chunk async for chunk in upstream.chunks()])
    except BaseException:
        upstream.close()
        raise


def _is_small(headers: list[tuple[bytes, bytes]]) -> bool:
    """A fixed-length answer small enough to hold whole (chunked and event-stream answers
    run open-ended and stream as they come)."""
    for name, value in headers:
        if name == b"content-length":
            return value.isdigit() and int(value) <= _WHOLE_ANSWER_MAX_BYTES
    return False


async def _client_left(receive: Receive) -> None:
    """Return when the client disconnects. The body has been read, so ``http.disconnect``
    is the only message left to come."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _sse_with_error_event(chunks: AsyncIterator[bytes], url: str) -> AsyncIterator[bytes]:
    """An event stream that ends in an ``error`` event if the worker fails mid-stream: the
    status line has gone already, and a cut stream looks to SSE clients like a clean end."""
    try:
        async for chunk in chunks:
            yield chunk
    except (UpstreamProtocolError, UpstreamReadTimeoutError) as exc:
        logger.warning("event stream from %s failed: %r", url, exc)
        error = {"error": f"worker {url} failed mid-stream: {exc}"}
        yield b"event: error\ndata: " + orjson.dumps(error) + b"\n\n"


def _target(scope: Scope) -> str:
    """The request target as the client sent it: raw path (escapes kept) and query."""
    raw_path: bytes | None = scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else quote(scope["path"])
    query: bytes = scope.get("query_string", b"")
    return f"{path}?{query.decode('latin-1')}" if query else path


def _request_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's headers minus hop-by-hop ones, including those named in ``Connection``."""
    headers = list(raw)
    skip = _NOT_FORWARDED
    for name, value in headers:
        if name == b"connection":
            skip = skip | {token.strip() for token in value.lower().split(b",")}
    return [(name, value) for name, value in headers if name not in skip]
