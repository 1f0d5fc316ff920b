"""The one place where control-plane errors become HTTP responses (STYLE C10).

Bodies are the OIP error shape ``{"error": "..."}``; a schema error adds ``"fields"``, the
dotted paths of the fields at fault. Unknown exceptions answer 500 with a generic message and
leave the traceback to the log.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from control_plane.errors import (
    ConflictError,
    ControlPlaneUnavailableError,
    InvalidInputError,
    InvalidRegistrationError,
    KeyNotFoundError,
    ModelNotFoundError,
    SchemaValidationError,
    UnauthorizedError,
    WorkerCallError,
)
from foundation.errors import ModelFailedError, ZeroserveError
from foundation.http import (
    error_response,
    handle_http_exception,
    handle_unexpected,
    status_for as _status_for,
)

__all__ = [
    "STATUS",
    "error_response",
    "from_error",
    "handle_http_exception",
    "handle_unexpected",
    "handle_zeroserve_error",
    "status_for",
]

logger = logging.getLogger(__name__)

STATUS: dict[type[BaseException], int] = {
    InvalidInputError: 400,
    SchemaValidationError: 422,
    InvalidRegistrationError: 422,
    # Failed Dependency: the model's own load fails; not a server fault, and a retry
    # without a change fails the same way.
    ModelFailedError: 424,
    UnauthorizedError: 401,
    ModelNotFoundError: 404,
    KeyNotFoundError: 404,
    ConflictError: 409,
    ControlPlaneUnavailableError: 503,
    WorkerCallError: 502,
}
"""Error class -> status; a subclass takes the status of its nearest mapped ancestor."""


def status_for(error: ZeroserveError) -> int:
    """The HTTP status of ``error``: the first class in its MRO with a mapping."""
    return _status_for(error, STATUS)


def from_error(error: ZeroserveError) -> Response:
    headers: dict[str, str] = {}
    extra: dict[str, Any] = {}
    if isinstance(error, ControlPlaneUnavailableError):
        headers["Retry-After"] = str(error.retry_after_s)
    if isinstance(error, UnauthorizedError):
        headers["WWW-Authenticate"] = 'Bearer realm="zeroserve-admin"'
    if isinstance(error, SchemaValidationError):
        extra["fields"] = list(error.fields)
    return error_response(error.message, status_for(error), headers, extra)


async def handle_zeroserve_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ZeroserveError)
    if status_for(exc) >= 500:
        logger.warning("%s %s: %s", request.method, request.url.path, exc.message)
    return from_error(exc)
