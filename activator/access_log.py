"""The access log: one line per request the activator answers, HTTP or gRPC.

A line says when the request came, its request id, the caller's key id (never the key),
the model, the protocol (``http``, ``openai`` for the ``/v1`` paths, ``grpc``), the method
and path (the RPC for gRPC), the status, the latency to the end of the answer, whether the
request waited in the buffer for a replica (a cold start, or a queue behind one) and how
long, and the bytes of the request and answer bodies. Health probes and metric scrapes are
not logged.

The entry of the request being served travels in a context variable, so that the parts
that know something only the middle of the request path knows (the proxy's wait in the
buffer, a gRPC call's model, the key an authenticator accepted) add it where they learn it
with :func:`note_activation_wait`, :func:`note_model` and :func:`note_key_id`, without
being handed the entry. Those are no-ops when the log is off.

HTTP requests are logged by :class:`AccessLogMiddleware` (pure ASGI), gRPC calls through
:class:`GrpcCallLog` (by :class:`AccessLogInterceptor` on grpc.aio, by
`activator.grpc.front` on the h2corn front end); both hand finished entries to
:class:`AccessLog`, which formats the line (text or JSON) and writes it to the
``zeroserve.access`` logger. Where that logger writes is the process's entry point's choice.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import grpc
import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from activator.metrics import marked_model
from foundation import request_ids

__all__ = [
    "ACCESS_LOGGER",
    "AccessEntry",
    "AccessLog",
    "AccessLogFormat",
    "AccessLogInterceptor",
    "AccessLogMiddleware",
    "GrpcCallLog",
    "LoggedCall",
    "RequestIdMiddleware",
    "current_request_id",
    "interrupted_status",
    "note_activation_wait",
    "note_key_id",
    "note_model",
    "request_id_of",
]

ACCESS_LOGGER: Final = "zeroserve.access"
"""The logger the lines go to, at INFO."""

_UNLOGGED_PATHS: Final = frozenset({"/v2/health/live", "/v2/health/ready", "/metrics"})
"""Load balancers, kubelets and Prometheus call these every few seconds each."""
_UNLOGGED_RPCS: Final = frozenset({"ServerLive", "ServerReady"})
_REQUEST_ID_KEY: Final = "zeroserve.request_id"
"""Where :class:`RequestIdMiddleware` leaves the request's id in its scope."""
_NONE: Final = "-"


class AccessLogFormat(enum.StrEnum):
    """How a line is written."""

    TEXT = "text"
    """``key=value`` pairs separated by spaces; a value with a space, quote or ``=`` in it
    is written as a JSON string."""
    JSON = "json"
    """One JSON object a line."""


@dataclass(slots=True)
class AccessEntry:
    """One request, filled in as it is served."""

    started_at: float
    """Wall-clock seconds since the epoch when it came."""
    request_id: str
    protocol: str
    """``http``, ``openai`` or ``grpc``."""
    method: str
    """The HTTP method, or ``POST`` for gRPC (every RPC is one)."""
    target: str
    """The HTTP path, or the gRPC method's full name."""
    model: str | None = None
    key_id: str | None = None
    status: int | str = 500
    """The HTTP status code, or the gRPC status code's name (``OK``...)."""
    latency_s: float = 0.0
    wait_s: float | None = None
    """Time spent waiting in the buffer for a replica; None when it never waited."""
    bytes_in: int = 0
    bytes_out: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "time": _timestamp(self.started_at),
            "request_id": self.request_id,
            "key_id": self.key_id,
            "model": self.model,
            "protocol": self.protocol,
            "method": self.method,
            "target": self.target,
            "status": self.status,
            "latency_ms": round(self.latency_s * 1000, 3),
            "waited": self.wait_s is not None,
            "wait_ms": round((self.wait_s or 0.0) * 1000, 3),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        }


_current: ContextVar[AccessEntry | None] = ContextVar("zeroserve_access_entry", default=None)


def note_activation_wait(waited_s: float) -> None:
    """Add ``waited_s`` spent in the buffer to the current request's entry."""
    entry = _current.get()
    if entry is not None:
        entry.wait_s = (entry.wait_s or 0.0) + waited_s


def note_model(model: str) -> None:
    """Name the current request's model (the first one named, for a gRPC stream)."""
    entry = _current.get()
    if entry is not None and entry.model is None:
        entry.model = model


def note_key_id(key_id: str) -> None:
    """Name the public id of the key the current request was accepted with (gRPC; on HTTP
    the middleware reads ``scope["state"]["key_id"]``)."""
    entry = _current.get()
    if entry is not None:
        entry.key_id = key_id


def current_request_id() -> str | None:
    """The id of the request being logged now; None outside one (or with the log off)."""
    entry = _current.get()
    return None if entry is None else entry.request_id


def request_id_of(scope: Scope) -> str | None:
    """The id :class:`RequestIdMiddleware` gave the request of ``scope``."""
    request_id: str | None = scope.get(_REQUEST_ID_KEY)
    return request_id


class AccessLog:
    """Formats finished entries and writes them, one line each.

    Parameters:
        log_format: text or JSON.
        logger: where the lines go; ``zeroserve.access`` when None.
    """

    def __init__(self, log_format: AccessLogFormat, logger: logging.Logger | None = None) -> None:
        self._format = AccessLogFormat(log_format)
        self._logger = logger or logging.getLogger(ACCESS_LOGGER)

    def write(self, entry: AccessEntry) -> None:
        """Log ``entry`` (at INFO)."""
        if not self._logger.isEnabledFor(logging.INFO):
            return
        if self._format is AccessLogFormat.JSON:
            line = orjson.dumps(entry.to_json()).decode()
        else:
            line = _text(entry)
        # What logger.info does but looking up the caller's frame, which no line names.
        logger = self._logger
        logger.handle(logger.makeRecord(logger.name, logging.INFO, __file__, 0, line, (), None))


class RequestIdMiddleware:
    """Gives every HTTP request an ``X-Request-ID``: the caller's when usable (see
    :func:`foundation.request_ids.is_usable`), else a new one put in the request's headers
    in its place, so that the worker gets it too. An error answer (status 400 and up) names
    it in the same header unless the worker's answer already does; a successful answer
    passes through byte for byte, as the proxy promises. ``traceparent`` passes through
    untouched.

    Parameters:
        app: the wrapped application.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        raw = request_ids.find_request_id(headers)
        if raw is None or not request_ids.is_usable(raw):
            request_id = request_ids.new_request_id()
            raw = request_id.encode("ascii")
            kept = [header for header in headers if header[0] != request_ids.HEADER]
            scope["headers"] = [*kept, (request_ids.HEADER, raw)]
        else:
            request_id = raw.decode("ascii")
        scope[_REQUEST_ID_KEY] = request_id
        named = raw

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                answer_headers = message.get("headers", ())
                if not any(name.lower() == request_ids.HEADER for name, _ in answer_headers):
                    message = {**message, "headers": [*answer_headers, (request_ids.HEADER, named)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


class AccessLogMiddleware:
    """Writes one access-log line for every HTTP request but health probes and metric
    scrapes, once its answer has ended or the app has failed (then as 500, unless a status
    was sent). Sits inside :class:`RequestIdMiddleware`, whose id it logs.

    Parameters:
        app: the wrapped application.
        log: where the entries go.
        clock: wall-clock seconds (the line's time); tests inject a fixed one.
    """

    def __init__(
        self, app: ASGIApp, log: AccessLog, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.app = app
        self.log = log
        self._clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _UNLOGGED_PATHS:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path: str = scope["path"]
        entry = AccessEntry(
            started_at=self._clock(),
            request_id=request_id_of(scope) or _NONE,
            protocol="openai" if path.startswith("/v1/") else "http",
            method=scope["method"],
            target=path,
        )

        async def counting_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                entry.bytes_in += len(message.get("body", b""))
            return message

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                entry.status = message["status"]
            elif message["type"] == "http.response.body":
                entry.bytes_out += len(message.get("body", b""))
            await send(message)

        token = _current.set(entry)
        try:
            await self.app(scope, counting_receive, counting_send)
        finally:
            _current.reset(token)
            entry.latency_s = time.perf_counter() - started
            # The router marks the model in this same scope dict once it is known.
            entry.model = marked_model(scope) or entry.model
            state = scope.get("state")
            key_id = state.get("key_id") if isinstance(state, dict) else None
            if isinstance(key_id, str):
                entry.key_id = key_id
            self.log.write(entry)


class GrpcCallLog:
    """The access log of one gRPC server, whichever front end carries it: one line per call
    (a stream is one call, logged when it ends, with the first model it named), health RPCs
    left out. :class:`AccessLogInterceptor` (grpc.aio) and the h2corn front end's wrapper
    (`activator.grpc.front`) both log through it, so their lines agree.

    Parameters:
        log: where the entries go.
        clock: wall-clock seconds (the line's time).
    """

    __slots__ = ("_log", "_clock")

    def __init__(self, log: AccessLog, *, clock: Callable[[], float] = time.time) -> None:
        self._log = log
        self._clock = clock

    @staticmethod
    def is_logged(method: str) -> bool:
        """Whether calls of ``method`` (its full name) get a line."""
        return method.rsplit("/", 1)[-1] not in _UNLOGGED_RPCS

    def start(self, method: str, metadata: Iterable[tuple[str, Any]] | None) -> LoggedCall:
        """A call of ``method`` with the client's ``metadata`` (as grpc.aio gives it) begins.

        Its id is its ``x-request-id`` when usable, else a new one; until
        :meth:`LoggedCall.finish`, its entry is the current one, so that
        :func:`current_request_id` and the ``note_*`` functions reach it. Call this, and
        ``finish``, in the task (and context) that serves the call.
        """
        request_id = None
        for key, value in metadata or ():
            if key == request_ids.METADATA_KEY and isinstance(value, str):
                request_id = value if request_ids.is_usable(value) else None
                break
        entry = AccessEntry(
            started_at=self._clock(),
            request_id=request_id or request_ids.new_request_id(),
            protocol="grpc",
            method="POST",
            target=method,
        )
        return LoggedCall(entry, self._log, time.perf_counter(), _current.set(entry))


class LoggedCall:
    """A gRPC call being logged (from :meth:`GrpcCallLog.start`): the front end adds the
    bytes of its messages to :attr:`entry` and calls :meth:`finish` once when it ends."""

    __slots__ = ("entry", "_log", "_started", "_token")

    def __init__(
        self, entry: AccessEntry, log: AccessLog, started: float, token: Token[AccessEntry | None]
    ) -> None:
        self.entry = entry
        """The call's entry; ``bytes_in`` and ``bytes_out`` are the front end's to count."""
        self._log = log
        self._started = started
        self._token = token

    def finish(self, code: grpc.StatusCode) -> None:
        """The call ended with ``code``: its entry stops being the current one, and its
        line is written."""
        _current.reset(self._token)
        entry = self.entry
        entry.latency_s = time.perf_counter() - self._started
        entry.status = code.name
        self._log.write(entry)


_Behavior = Callable[..., Any]
_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class AccessLogInterceptor(grpc.aio.ServerInterceptor):
    """The access log of the activator's grpc.aio server (see :class:`GrpcCallLog`).

    The call's id is its ``x-request-id`` metadata when usable, else a new one, which the
    forwarding code passes on to the worker (:func:`current_request_id`).

    Parameters:
        log: where the entries go.
        clock: wall-clock seconds (the line's time).
    """

    def __init__(self, log: AccessLog, *, clock: Callable[[], float] = time.time) -> None:
        self._calls = GrpcCallLog(log, clock=clock)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not self._calls.is_logged(method):
            return handler
        metadata = handler_call_details.invocation_metadata
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, method, metadata),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(handler.stream_stream, method, metadata),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _unary(self, behavior: _Behavior, method: str, metadata: Any) -> _Behavior:
        async def logged(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            call = self._calls.start(method, metadata)
            call.entry.bytes_in = _size(request)
            try:
                response = await behavior(request, context)
            except BaseException as exc:
                call.finish(_ended(context, exc))
                raise
            call.entry.bytes_out = _size(response)
            call.finish(_ended(context, None))
            return response

        return logged

    def _stream(self, behavior: _Behavior, method: str, metadata: Any) -> _Behavior:
        async def logged(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            call = self._calls.start(method, metadata)
            entry = call.entry

            async def counted() -> AsyncIterator[Any]:
                async for request in requests:
                    entry.bytes_in += _size(request)
                    yield request

            interruption: BaseException | None = None
            try:
                async for response in behavior(counted(), context):
                    entry.bytes_out += _size(response)
                    yield response
            except BaseException as exc:
                interruption = exc
                raise
            finally:
                call.finish(_ended(context, interruption))

        return logged


def _ended(
    context: grpc.aio.ServicerContext[Any, Any], interruption: BaseException | None
) -> grpc.StatusCode:
    """How a grpc.aio call ended, as its context and the handler's exception tell."""
    code = context.code()
    # A status the handler set (abort included) is the call's. Without one: the handler
    # returned normally (OK, unless the call was cancelled meanwhile), or was interrupted.
    if isinstance(code, grpc.StatusCode):
        return code
    if interruption is not None:
        return interrupted_status(interruption, context.time_remaining())
    return grpc.StatusCode.CANCELLED if context.cancelled() else grpc.StatusCode.OK


def interrupted_status(exc: BaseException, time_remaining: float | None) -> grpc.StatusCode:
    """The status of a call whose handler ``exc`` interrupted before it set one, on either
    front end: a cancellation is DEADLINE_EXCEEDED once the deadline has passed (the front
    end cancels the handler then), else CANCELLED (the client left); a stream closed early
    (GeneratorExit) is CANCELLED; any other exception UNKNOWN, as both answer it."""
    if isinstance(exc, asyncio.CancelledError):
        if time_remaining is not None and time_remaining <= 0:
            return grpc.StatusCode.DEADLINE_EXCEEDED
        return grpc.StatusCode.CANCELLED
    if isinstance(exc, GeneratorExit):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN


def _size(message: Any) -> int:
    return len(message) if isinstance(message, bytes | bytearray) else 0


def _timestamp(seconds: float) -> str:
    whole = int(seconds)
    return f"{_second(whole)}.{int((seconds - whole) * 1000):03d}Z"


@functools.lru_cache(maxsize=4)
def _second(whole: int) -> str:
    # Cached: lines of one second share it, and formatting a date costs more than the rest.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))


def _text(entry: AccessEntry) -> str:
    # One f-string: a line is written per request, and this is most of its cost.
    wait_s = entry.wait_s
    return (
        f"time={_timestamp(entry.started_at)} request_id={_value(entry.request_id)} "
        f"key_id={_value(entry.key_id or _NONE)} model={_value(entry.model or _NONE)} "
        f"protocol={entry.protocol} method={_value(entry.method)} "
        f"target={_value(entry.target)} status={entry.status} "
        f"latency_ms={entry.latency_s * 1000:.3f} waited={'no' if wait_s is None else 'yes'} "
        f"wait_ms={'0' if wait_s is None else f'{wait_s * 1000:.3f}'} "
        f"bytes_in={entry.bytes_in} bytes_out={entry.bytes_out}"
    )


_PLAIN: Final = re.compile(r"[!#-<>-~]+")
"""Visible ASCII but ``"`` and ``=``: a value of these alone cannot break a text line."""


def _value(value: str) -> str:
    """``value`` as is when it cannot break the line's parsing, else as a JSON string."""
    if _PLAIN.fullmatch(value):
        return value
    return orjson.dumps(value).decode()
