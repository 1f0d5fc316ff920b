"""The activator's RPCs on the h2corn front end (`foundation.grpc_front`).

The router's handlers are grpc.aio's, and ask three things of their context: the client's
metadata, the time left before its deadline, and ``abort``. :class:`FrontContext` answers
those from the front end's call, so the same handlers serve both front ends; ``abort``
raises the front end's RpcStatusError, which ends the call with the status and trailing
metadata (``grpc-retry-pushback-ms``...) as grpc.aio's would.

With the access log on, each call is logged through the same `GrpcCallLog` as
`AccessLogInterceptor` logs grpc.aio's calls, its entry current while the handler runs, so
the handlers find the same request id (`current_request_id`) on both front ends.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final, NoReturn, cast

import grpc

from activator.access_log import AccessLog, GrpcCallLog, interrupted_status
from activator.grpc.dispatch import SERVICE
from foundation.grpc_front.app import CallContext, ClientGoneError, StreamRpc, UnaryRpc
from foundation.grpc_front.wire import RpcStatusError

__all__ = ["FrontContext", "front_rpcs"]

_Context = grpc.aio.ServicerContext[bytes, bytes]
_UnaryBehaviour = Callable[[bytes, _Context], Awaitable[bytes]]
_StreamBehaviour = Callable[[AsyncIterator[bytes], _Context], AsyncGenerator[bytes, None]]
_HTTP_ONLY: Final = frozenset({b"content-type", b"te", b"host"})
"""Request headers that are HTTP/2's, not metadata (grpc.aio leaves them out too). ``host``
is the ``:authority`` ASGI servers present as a header: passed on to a worker beside the
channel's own ``:authority``, it gets the call reset there (PROTOCOL_ERROR)."""


def _unpadded_b64decode(value: bytes) -> bytes:
    return base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)


class FrontContext:
    """The part of grpc.aio's ServicerContext the router's handlers use, over ``call``."""

    __slots__ = ("_call", "_metadata")

    def __init__(self, call: CallContext) -> None:
        self._call = call
        self._metadata: tuple[tuple[str, str | bytes], ...] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """The client's metadata as grpc.aio gives it: text values as str, ``-bin``
        values base64-decoded to bytes; pseudo-headers and HTTP's own left out."""
        # Read by the access log, the key check and the forwarding: decoded once.
        if self._metadata is None:
            self._metadata = self._decoded()
        return self._metadata

    def _decoded(self) -> tuple[tuple[str, str | bytes], ...]:
        pairs: list[tuple[str, str | bytes]] = []
        for name, value in self._call.metadata:
            if name.startswith(b":") or name in _HTTP_ONLY:
                continue
            key = name.decode("latin-1")
            if key.endswith("-bin"):
                try:
                    pairs.append((key, _unpadded_b64decode(value)))
                except binascii.Error:
                    continue  # grpc.aio drops a -bin value that is not base64 too
            else:
                pairs.append((key, value.decode("latin-1")))
        return tuple(pairs)

    def time_remaining(self) -> float | None:
        return self._call.time_remaining()

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Sequence[tuple[str, str | bytes]] = (),
    ) -> NoReturn:
        trailers = []
        for key, value in trailing_metadata:
            if isinstance(value, bytes):
                encoded = base64.b64encode(value).rstrip(b"=")
            else:
                encoded = value.encode("latin-1")
            trailers.append((key.encode("latin-1"), encoded))
        raise RpcStatusError(code, details, trailers)


def _front_unary(handle: _UnaryBehaviour) -> UnaryRpc:
    async def serve(data: bytes, call: CallContext) -> bytes:
        return await handle(data, cast(_Context, FrontContext(call)))

    return UnaryRpc(serve)


def _front_stream(handle: _StreamBehaviour) -> StreamRpc:
    def serve(requests: AsyncIterator[bytes], call: CallContext) -> AsyncIterator[bytes]:
        return handle(requests, cast(_Context, FrontContext(call)))

    return StreamRpc(serve)


def _logged_unary(handle: _UnaryBehaviour, path: str, calls: GrpcCallLog) -> UnaryRpc:
    async def serve(data: bytes, call: CallContext) -> bytes:
        context = FrontContext(call)
        logged = calls.start(path, context.invocation_metadata())
        logged.entry.bytes_in = len(data)
        try:
            answer = await handle(data, cast(_Context, context))
        except BaseException as exc:
            logged.finish(_ended(exc, call))
            raise
        logged.entry.bytes_out = len(answer)
        logged.finish(grpc.StatusCode.OK)
        return answer

    return UnaryRpc(serve)


def _logged_stream(handle: _StreamBehaviour, path: str, calls: GrpcCallLog) -> StreamRpc:
    async def serve(requests: AsyncIterator[bytes], call: CallContext) -> AsyncIterator[bytes]:
        context = FrontContext(call)
        logged = calls.start(path, context.invocation_metadata())
        entry = logged.entry

        async def counted() -> AsyncIterator[bytes]:
            async for request in requests:
                entry.bytes_in += len(request)
                yield request

        code = grpc.StatusCode.OK
        try:
            # Closed here, not left to the garbage collector, should this generator be
            # closed early (the front end closes it when the client is gone).
            async with contextlib.aclosing(handle(counted(), cast(_Context, context))) as answers:
                async for answer in answers:
                    entry.bytes_out += len(answer)
                    yield answer
        except BaseException as exc:
            code = _ended(exc, call)
            raise
        finally:
            logged.finish(code)

    return StreamRpc(serve)


def _ended(exc: BaseException, call: CallContext) -> grpc.StatusCode:
    """The status a call ends with when its handler raised ``exc``, as the front end
    (`foundation.grpc_front.app.GrpcApp`) answers it."""
    if isinstance(exc, RpcStatusError):
        return exc.code
    if isinstance(exc, ClientGoneError):
        return grpc.StatusCode.CANCELLED
    return interrupted_status(exc, call.time_remaining())


def front_rpcs(
    methods: dict[str, grpc.RpcMethodHandler[Any, Any]],
    access_log: AccessLog | None = None,
) -> dict[str, UnaryRpc | StreamRpc]:
    """The router's ``methods`` (its grpc.aio method handlers, each taking and giving
    bytes) for `foundation.grpc_front`, keyed by path; with ``access_log``, each call but
    the health RPCs writes its line there, as `AccessLogInterceptor` does on grpc.aio."""
    calls = None if access_log is None else GrpcCallLog(access_log)
    rpcs: dict[str, UnaryRpc | StreamRpc] = {}
    for name, method in methods.items():
        path = f"/{SERVICE}/{name}"
        log = calls if calls is not None and calls.is_logged(path) else None
        # grpc's stubs type the behaviours as the sync server's; the router's are async.
        if method.stream_stream is not None:
            stream = cast(_StreamBehaviour, method.stream_stream)
            rpcs[path] = _front_stream(stream) if log is None else _logged_stream(stream, path, log)
        else:
            assert method.unary_unary is not None, f"{name} is neither unary nor a stream"
            unary = cast(_UnaryBehaviour, method.unary_unary)
            rpcs[path] = _front_unary(unary) if log is None else _logged_unary(unary, path, log)
    return rpcs
