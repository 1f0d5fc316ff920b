"""The one place where data plane errors become HTTP responses."""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import Response

from data_plane.errors import (
    InternalError,
    InvalidArgumentError,
    ModelLoadError,
    NotFoundError,
    UnavailableError,
    UnsupportedCompressionError,
    UnsupportedError,
    ZeroserveError,
)
from foundation.http import (
    error_response,
    status_for as _status_for,
)

logger = logging.getLogger(__name__)

STATUS: dict[type[BaseException], int] = {
    InvalidArgumentError: 400,
    ModelLoadError: 400,
    NotFoundError: 404,
    UnavailableError: 503,
    UnsupportedError: 501,
    InternalError: 500,
}
"""Error class -> status; a subclass takes the status of its nearest mapped ancestor."""


def status_for(error: ZeroserveError) -> int:
    """The HTTP status of ``error`` (Triton's codes for Triton's error kinds)."""
    return _status_for(error, STATUS)


def from_error(error: ZeroserveError) -> Response:
    status = status_for(error)
    headers: dict[str, str] = {}
    if isinstance(error, UnavailableError):
        headers["Retry-After"] = str(error.retry_after_s)
    if isinstance(error, UnsupportedCompressionError):
        headers["Accept-Encoding"] = ", ".join(error.accepted_encodings)
    return error_response(error.message, status, headers)


async def handle_zeroserve_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ZeroserveError)
    return from_error(exc)
