"""gRPC-Web (the grpc-web protocol document, PROTOCOL-WEB.md): a `GrpcApp`'s calls over an
HTTP/1.1 server, and the bytes of a call as its client sends and reads them.

HTTP/1.1 has no trailers an ASGI server sends, so gRPC-Web carries the status in the body:
after the messages, one frame whose flag has its top bit set holds the trailers as
``name:value\\r\\n`` lines. The server side wraps a `GrpcApp` (so its limits, deadlines and
statuses are the HTTP/2 front end's); the client side is for the activator's hop to its
workers, where one HTTP/1.1 request on a pooled keep-alive connection costs less than a
grpc.aio call (``bench/grpc_activator.py``).
"""

from __future__ import annotations

import asyncio
import base64
import struct
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import grpc
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "CONTENT_TYPE",
    "GrpcWebApp",
    "WebAnswer",
    "WebProtocolError",
    "is_grpc_web",
    "metadata_headers",
    "parse_answer",
    "request_body",
    "timeout_header",
]

CONTENT_TYPE: Final = b"application/grpc-web+proto"
_TRAILER_FLAG: Final = 0x80
_HEADER: Final = struct.Struct(">BI")
_CODES: Final = {code.value[0]: code for code in grpc.StatusCode}
_HOP_KEYS: Final = frozenset({b"grpc-status", b"grpc-message"})


_WEB_TYPES: Final = frozenset({b"application/grpc-web", CONTENT_TYPE})
"""Binary gRPC-Web; the base64 ``-text`` variant browsers may send is not served."""


def is_grpc_web(scope: Scope) -> bool:
    """Whether an HTTP request is a (binary) gRPC-Web call, as its content type says."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() in _WEB_TYPES
    return False


class GrpcWebApp:
    """``app`` (a `GrpcApp`) answering gRPC-Web: its response headers become gRPC-Web's,
    its body passes through, and its trailers go out as the body's last frame."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_web(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                await send(
                    {
                        "type": kind,
                        "status": message["status"],
                        "headers": [(b"content-type", CONTENT_TYPE)],
                    }
                )
            elif kind == "http.response.body":
                # The end of the body is the trailers' frame, not this.
                if message.get("body"):
                    await send({"type": kind, "body": message["body"], "more_body": True})
            elif kind == "http.response.trailers":
                await send(
                    {
                        "type": "http.response.body",
                        "body": _trailer_frame(message["headers"]),
                        "more_body": False,
                    }
                )

        # A client that goes away cancels its call, as an HTTP/2 reset does: once the
        # request is read, the next thing the server can say is that the client left.
        serving = asyncio.current_task()
        assert serving is not None
        watcher: asyncio.Task[None] | None = None
        left = False

        async def watch() -> None:
            nonlocal left
            if (await receive())["type"] == "http.disconnect":
                left = True
                serving.cancel()

        async def receive_body() -> Message:
            nonlocal watcher
            message = await receive()
            if watcher is None and not (
                message["type"] == "http.request" and message.get("more_body", False)
            ):
                watcher = asyncio.create_task(watch())
            return message

        try:
            await self._app(scope, receive_body, send_web)
        except asyncio.CancelledError:
            if not left or serving.uncancel() > 0:
                raise
        finally:
            if watcher is not None:
                watcher.cancel()


def _trailer_frame(trailers: Iterable[tuple[bytes, bytes]]) -> bytes:
    block = b"".join(name + b":" + value + b"\r\n" for name, value in trailers)
    return _HEADER.pack(_TRAILER_FLAG, len(block)) + block


class WebProtocolError(Exception):
    """An answer that is not a well-formed gRPC-Web response."""


@dataclass(frozen=True, slots=True)
class WebAnswer:
    """A call's end as its client reads it."""

    code: grpc.StatusCode
    message: str
    """``grpc-message``, percent-decoded."""
    messages: list[bytes]
    trailing_metadata: tuple[tuple[str, str | bytes], ...]
    """The trailers but the status, ``-bin`` values decoded, as grpc.aio gives them."""


def request_body(message: bytes) -> bytes:
    """One uncompressed message, framed."""
    return _HEADER.pack(0, len(message)) + message


def timeout_header(timeout_s: float) -> bytes:
    """``grpc-timeout`` for ``timeout_s`` seconds, in milliseconds rounded up (at least 1:
    a deadline is never sent as none)."""
    millis = max(int(-(-timeout_s * 1000 // 1)), 1)
    if millis < 100_000_000:
        return b"%dm" % millis
    return b"%dS" % min(-(-millis // 1000), 99_999_999)


_FRAMING: Final = frozenset(
    {
        "connection",
        "content-length",
        "content-type",
        "expect",
        "host",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""Names HTTP/1.1 reads as the request's framing or its connection's: as metadata they would
change what the request means (a caller's ``transfer-encoding`` smuggling a second request
onto a shared connection), so they are never sent as metadata."""
_UNSAFE: Final = frozenset("\r\n\0")


def metadata_headers(metadata: Iterable[tuple[str, str | bytes]]) -> list[tuple[bytes, bytes]]:
    """gRPC metadata as HTTP headers: ``-bin`` values base64 (as gRPC sends them on the
    wire), text values as they are (gRPC allows printable ASCII only). Framing and
    connection names, and names or values no HTTP/1.1 header can carry, are left out."""
    headers: list[tuple[bytes, bytes]] = []
    for key, value in metadata:
        if key in _FRAMING or not key.isascii() or _UNSAFE.intersection(key):
            continue
        if key.endswith("-bin"):
            raw = value if isinstance(value, bytes) else value.encode("latin-1")
            headers.append((key.encode("ascii"), base64.b64encode(raw)))
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        if text.isascii() and not _UNSAFE.intersection(text):
            headers.append((key.encode("ascii"), text.encode("ascii")))
    return headers


def parse_answer(body: bytes, max_message_bytes: int) -> WebAnswer:
    """The messages and status in a whole gRPC-Web response ``body``.

    Raises:
        WebProtocolError: truncated frames, a compressed or oversized message, no trailers,
            or bytes after them.
    """
    messages: list[bytes] = []
    at = 0
    end = len(body)
    while at + _HEADER.size <= end:
        flag, length = _HEADER.unpack_from(body, at)
        at += _HEADER.size
        if at + length > end:
            raise WebProtocolError("the answer ends inside a frame")
        chunk = body[at : at + length]
        at += length
        if flag & _TRAILER_FLAG:
            if at != end:
                raise WebProtocolError("bytes after the trailers")
            return _answer(chunk, messages)
        if flag != 0:
            raise WebProtocolError(f"unexpected frame flag {flag:#x}")
        if length > max_message_bytes:
            raise WebProtocolError(
                f"Received message larger than max ({length} vs. {max_message_bytes})"
            )
        messages.append(chunk)
    raise WebProtocolError("the answer has no trailers")


def _answer(block: bytes, messages: list[bytes]) -> WebAnswer:
    code: grpc.StatusCode | None = None
    message = ""
    metadata: list[tuple[str, str | bytes]] = []
    for line in block.split(b"\r\n"):
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            raise WebProtocolError("a trailer line without ':'")
        name = name.strip().lower()
        value = value.strip()
        if name == b"grpc-status":
            found = _CODES.get(int(value)) if value.isdigit() else None
            if found is None:
                raise WebProtocolError(f"unknown grpc-status {value[:16]!r}")
            code = found
        elif name == b"grpc-message":
            message = urllib.parse.unquote(value.decode("ascii", "replace"))
        elif name not in _HOP_KEYS:
            key = name.decode("ascii", "replace")
            if key.endswith("-bin"):
                try:
                    raw = base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)
                except ValueError:
                    raise WebProtocolError(f"trailer {key} is not base64") from None
                metadata.append((key, raw))
            else:
                metadata.append((key, value.decode("latin-1")))
    if code is None:
        raise WebProtocolError("the trailers carry no grpc-status")
    return WebAnswer(code, message, messages, tuple(metadata))
