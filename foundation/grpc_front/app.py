"""gRPC calls as an ASGI app over an HTTP/2 server that sends trailers.

Each request to ``/<service>/<method>`` is a call: its body is read as length-prefixed
messages (gzip and deflate accepted, each message bounded before and after decompression),
given to the method's handler as bytes, and its answers go out framed, ending with the
``grpc-status`` and ``grpc-message`` trailers. ``grpc-timeout`` becomes a deadline on the
handler (DEADLINE_EXCEEDED); a call beyond ``max_concurrent_rpcs`` and a message beyond
the size limits get RESOURCE_EXHAUSTED; an unknown method UNIMPLEMENTED, as gRPC core
answers them. Answers are sent uncompressed (gRPC lets a server choose).

Handlers are plain coroutines over bytes, with no transport type in sight, so the same
servicer serves this front end and grpc.aio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import grpc
from starlette.types import Receive, Scope, Send

from foundation.grpc_front.wire import (
    MessageReader,
    RpcStatusError,
    frame,
    parse_timeout,
    status_trailers,
)

__all__ = ["CallContext", "ClientGoneError", "GrpcApp", "Metadata", "StreamRpc", "UnaryRpc"]

logger = logging.getLogger(__name__)

Metadata = Sequence[tuple[bytes, bytes]]
"""A call's request headers as the HTTP/2 server decoded them (lowercase names)."""


_RESPONSE_HEADERS: Final = [
    (b"content-type", b"application/grpc"),
    (b"grpc-accept-encoding", b"identity,deflate,gzip"),
]
_ENCODINGS: Final = frozenset({"identity", "gzip", "deflate"})
_OK: Final = status_trailers(grpc.StatusCode.OK, "")


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a handler may read of its call besides the messages."""

    metadata: Metadata
    """The request headers (gRPC's own ``grpc-*`` and the pseudo-headers included)."""
    deadline: float | None
    """The client's deadline on the event loop's clock (``loop.time()``), or None."""

    def time_remaining(self) -> float | None:
        """Seconds left until the deadline (0 when past), or None without one."""
        if self.deadline is None:
            return None
        return max(self.deadline - asyncio.get_running_loop().time(), 0.0)


@dataclass(frozen=True, slots=True)
class UnaryRpc:
    """A method taking one message and answering one; ``handle`` raises RpcStatusError to
    end the call with another status."""

    handle: Callable[[bytes, CallContext], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class StreamRpc:
    """A bidirectional streaming method: ``handle`` gets the request messages as they
    arrive and yields its answers; raising RpcStatusError ends the call with its status."""

    handle: Callable[[AsyncIterator[bytes], CallContext], AsyncIterator[bytes]]


class ClientGoneError(Exception):
    """Raised by a stream's request iterator once the client has reset the call or closed
    its connection: nobody will read the status, so handlers let it pass (the front end
    drops the call)."""


class _Call:
    """One call's response side: headers once, then messages, then the status."""

    __slots__ = ("_send", "_max_send_bytes", "is_started", "is_ending")

    def __init__(self, send: Send, max_send_bytes: int) -> None:
        self._send = send
        self._max_send_bytes = max_send_bytes
        self.is_started = False
        self.is_ending = False

    async def _send_or_gone(self, event: dict[str, object]) -> None:
        try:
            await self._send(event)
        except OSError:
            # The ASGI server's answer to a send after the client reset the stream.
            raise ClientGoneError from None

    async def start(self) -> None:
        self.is_started = True
        await self._send_or_gone(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": _RESPONSE_HEADERS,
                "trailers": True,
            }
        )

    async def message(self, data: bytes) -> None:
        if len(data) > self._max_send_bytes:
            raise RpcStatusError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(data)} vs. {self._max_send_bytes})",
            )
        if not self.is_started:
            await self.start()
        await self._send_or_gone(
            {"type": "http.response.body", "body": frame(data), "more_body": True}
        )

    async def end(self, trailers: list[tuple[bytes, bytes]]) -> None:
        self.is_ending = True
        if not self.is_started:
            await self.start()
        await self._send_or_gone({"type": "http.response.body", "body": b"", "more_body": False})
        await self._send_or_gone({"type": "http.response.trailers", "headers": trailers})


class GrpcApp:
    """The ASGI app serving ``rpcs`` (``"/package.Service/Method"`` → its handler).

    Parameters:
        max_receive_bytes: largest request message, compressed or not.
        max_send_bytes: largest response message.
        max_concurrent_rpcs: calls served at once, streams included.
    """

    def __init__(
        self,
        rpcs: Mapping[str, UnaryRpc | StreamRpc],
        *,
        max_receive_bytes: int,
        max_send_bytes: int,
        max_concurrent_rpcs: int,
    ) -> None:
        self._rpcs = dict(rpcs)
        self._max_receive_bytes = max_receive_bytes
        self._max_send_bytes = max_send_bytes
        self._max_concurrent_rpcs = max_concurrent_rpcs
        self.active_rpcs = 0
        """Calls being served now."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        call = _Call(send, self._max_send_bytes)
        if self.active_rpcs >= self._max_concurrent_rpcs:
            await call.end(
                status_trailers(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!"
                )
            )
            return
        self.active_rpcs += 1
        try:
            await self._serve(scope, receive, call)
        except ClientGoneError:
            # Ended all the same: should the server have said "gone" of a stream the
            # client still reads, it gets a status instead of waiting for one forever.
            if not call.is_ending:
                with contextlib.suppress(ClientGoneError):
                    await call.end(status_trailers(grpc.StatusCode.CANCELLED, "Cancelled"))
        finally:
            self.active_rpcs -= 1

    async def _serve(self, scope: Scope, receive: Receive, call: _Call) -> None:
        trailers = _OK
        try:
            rpc = self._rpcs.get(scope["path"])
            if rpc is None:
                raise RpcStatusError(
                    grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {scope['path']}"
                )
            metadata: Metadata = scope["headers"]
            timeout_s: float | None = None
            encoding = "identity"
            for name, value in metadata:
                if name == b"grpc-timeout":
                    timeout_s = parse_timeout(value.decode("latin-1"))
                elif name == b"grpc-encoding":
                    encoding = value.decode("latin-1")
            if encoding not in _ENCODINGS:
                raise RpcStatusError(
                    grpc.StatusCode.UNIMPLEMENTED,
                    f"Compression algorithm {encoding!r} not supported",
                )
            reader = MessageReader(self._max_receive_bytes, encoding)
            deadline = None
            if timeout_s is not None:
                deadline = asyncio.get_running_loop().time() + timeout_s
            context = CallContext(metadata, deadline)
            try:
                async with asyncio.timeout_at(deadline):
                    if isinstance(rpc, UnaryRpc):
                        await self._unary(rpc, context, reader, receive, call)
                    else:
                        await self._stream(rpc, context, reader, receive, call)
            except TimeoutError:
                raise RpcStatusError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
                ) from None
        except RpcStatusError as exc:
            trailers = status_trailers(exc.code, exc.message) + list(exc.trailers)
        except ClientGoneError:
            raise
        except Exception:
            # Servicers turn their own errors into statuses; this is a bug.
            logger.exception("unexpected error serving %s", scope["path"])
            trailers = status_trailers(grpc.StatusCode.UNKNOWN, "Unexpected error")
        await call.end(trailers)

    @staticmethod
    async def _unary(
        rpc: UnaryRpc, context: CallContext, reader: MessageReader, receive: Receive, call: _Call
    ) -> None:
        messages: list[bytes] = []
        while True:
            event = await receive()
            if event["type"] != "http.request":
                raise ClientGoneError
            messages += reader.feed(event.get("body", b""))
            if not event.get("more_body", False):
                break
        reader.finish()
        if len(messages) != 1:
            raise RpcStatusError(
                grpc.StatusCode.INTERNAL, f"a unary call takes one message, got {len(messages)}"
            )
        await call.message(await rpc.handle(messages[0], context))

    @staticmethod
    async def _stream(
        rpc: StreamRpc, context: CallContext, reader: MessageReader, receive: Receive, call: _Call
    ) -> None:
        async def requests() -> AsyncIterator[bytes]:
            while True:
                event = await receive()
                if event["type"] != "http.request":
                    raise ClientGoneError
                for message in reader.feed(event.get("body", b"")):
                    yield message
                if not event.get("more_body", False):
                    reader.finish()
                    return

        # Headers first: a streaming client waits for them before it reads answers.
        await call.start()
        answers = rpc.handle(requests(), context)
        async with contextlib.aclosing(answers):  # type: ignore[type-var]
            async for answer in answers:
                await call.message(answer)
