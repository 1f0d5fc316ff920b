"""gRPC over HTTP/2 as bytes: the 5-byte message framing, ``grpc-timeout``, and the status
trailers (the "gRPC over HTTP2" protocol document, PROTOCOL-HTTP2.md).

Pure functions and one incremental reader; no sockets and no event loop, so each rule is
tested on its own.
"""

from __future__ import annotations

import gzip
import struct
import urllib.parse
import zlib
from collections.abc import Sequence
from typing import Final

import grpc

__all__ = [
    "RpcStatusError",
    "MessageReader",
    "decompress",
    "frame",
    "parse_timeout",
    "status_trailers",
]

_HEADER: Final = struct.Struct(">BI")
HEADER_BYTES: Final = _HEADER.size
_TIMEOUT_UNITS: Final = {
    "H": 3600.0,
    "M": 60.0,
    "S": 1.0,
    "m": 1e-3,
    "u": 1e-6,
    "n": 1e-9,
}
# grpc-message is percent-encoded outside printable ASCII and '%' itself.
_MESSAGE_SAFE: Final = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


class RpcStatusError(Exception):
    """Ends a call with ``code`` and ``message`` (what a servicer raises, and what the
    front end raises for a protocol fault it answers with a status), and ``trailers``
    beside them (encoded header pairs, e.g. ``grpc-retry-pushback-ms``)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        trailers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = trailers


def frame(message: bytes) -> bytes:
    """``message`` as one uncompressed length-prefixed gRPC message."""
    return _HEADER.pack(0, len(message)) + message


def parse_timeout(value: str) -> float:
    """Seconds of a ``grpc-timeout`` value (1 to 8 digits and a unit); raises
    RpcStatusError(INTERNAL) for a malformed one, as gRPC core does."""
    digits, unit = value[:-1], value[-1:]
    scale = _TIMEOUT_UNITS.get(unit)
    if scale is None or not 1 <= len(digits) <= 8 or not digits.isdigit():
        raise RpcStatusError(grpc.StatusCode.INTERNAL, f"invalid grpc-timeout: {value!r}")
    return int(digits) * scale


def status_trailers(code: grpc.StatusCode, message: str) -> list[tuple[bytes, bytes]]:
    """The trailers ending a call with ``code`` (and ``message``, percent-encoded)."""
    trailers = [(b"grpc-status", str(code.value[0]).encode())]
    if message:
        encoded = urllib.parse.quote(message, safe=_MESSAGE_SAFE)
        trailers.append((b"grpc-message", encoded.encode("ascii")))
    return trailers


def decompress(data: bytes, encoding: str, limit: int) -> bytes:
    """The message ``data`` compressed with ``encoding`` (gzip or deflate) decompressed, at
    most ``limit`` bytes of it: a larger one raises RESOURCE_EXHAUSTED, so a small
    compressed message cannot inflate past the message size limit."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error:
        raise RpcStatusError(
            grpc.StatusCode.INTERNAL, f"cannot decompress a {encoding} message"
        ) from None
    if len(out) > limit:
        raise RpcStatusError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"Received message larger than max (more than {limit} bytes decompressed)",
        )
    if not inflater.eof:
        raise RpcStatusError(grpc.StatusCode.INTERNAL, f"truncated {encoding} message")
    return out


def compress(data: bytes) -> bytes:
    """``data`` gzipped (for tests and clients; the server answers uncompressed)."""
    return gzip.compress(data)


class MessageReader:
    """Splits the request body's chunks into gRPC messages, refusing one larger than
    ``max_bytes`` as soon as its prefix is read (before its bytes arrive)."""

    def __init__(self, max_bytes: int, encoding: str) -> None:
        self._max_bytes = max_bytes
        self._encoding = encoding
        self._buffer = bytearray()
        self._need: int | None = None
        self._compressed = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """The messages completed by ``chunk``; raises RpcStatusError for a message over
        the limit or compressed without a ``grpc-encoding``."""
        if not self._buffer and self._need is None and len(chunk) >= HEADER_BYTES:
            # The common case, one whole message in one chunk: no copy into the buffer.
            flag, length = _HEADER.unpack_from(chunk)
            if len(chunk) == HEADER_BYTES + length and flag == 0:
                self._check(length)
                return [chunk[HEADER_BYTES:]]
        self._buffer += chunk
        messages: list[bytes] = []
        while True:
            if self._need is None:
                if len(self._buffer) < HEADER_BYTES:
                    return messages
                flag, length = _HEADER.unpack_from(self._buffer)
                self._check(length)
                self._compressed = flag & 1 == 1
                self._need = length
                del self._buffer[:HEADER_BYTES]
            if len(self._buffer) < self._need:
                return messages
            message = bytes(self._buffer[: self._need])
            del self._buffer[: self._need]
            self._need = None
            messages.append(self._inflate(message) if self._compressed else message)

    def finish(self) -> None:
        """The body ended: raises RpcStatusError(INTERNAL) if it ended inside a message."""
        if self._buffer or self._need is not None:
            raise RpcStatusError(grpc.StatusCode.INTERNAL, "the request ended inside a message")

    def _check(self, length: int) -> None:
        if length > self._max_bytes:
            raise RpcStatusError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({length} vs. {self._max_bytes})",
            )

    def _inflate(self, message: bytes) -> bytes:
        if self._encoding in ("identity", ""):
            raise RpcStatusError(
                grpc.StatusCode.INTERNAL,
                "a compressed message arrived without a grpc-encoding",
            )
        return decompress(message, self._encoding, self._max_bytes)
