"""Request ids: the ``X-Request-ID`` a request carries from the activator to the worker.

The activator gives every request one (the caller's, when it sent a usable one), passes it
on to the worker and names it in its access log; the worker names it in its error answers,
so an error a client reports can be found in the platform's logs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Final

__all__ = ["HEADER", "METADATA_KEY", "find_request_id", "is_usable", "new_request_id"]

HEADER: Final = b"x-request-id"
"""The HTTP header, lower case as ASGI servers give header names."""
METADATA_KEY: Final = "x-request-id"
"""The gRPC metadata key (gRPC keys are lower case)."""

_MAX_LENGTH: Final = 128


def new_request_id() -> str:
    """A fresh id: 32 hex digits (128 random bits, as a W3C trace id)."""
    return os.urandom(16).hex()


def is_usable(request_id: str | bytes) -> bool:
    """Whether a caller's id may be kept: 1 to 128 visible ASCII characters, so that it
    cannot break a log line or a header."""
    if isinstance(request_id, str):
        if not request_id.isascii():
            return False
        request_id = request_id.encode("ascii")
    return 0 < len(request_id) <= _MAX_LENGTH and all(0x21 <= c <= 0x7E for c in request_id)


def find_request_id(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The ``X-Request-ID`` of ASGI-style headers (lower-case names), usable or not."""
    for name, value in headers:
        if name == HEADER:
            return value
    return None
