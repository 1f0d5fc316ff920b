"""The one place where activator errors become HTTP responses: ``{"error": "..."}``, or
OpenAI's error object on the OpenAI paths (same status codes)."""

from __future__ import annotations

import logging

import orjson
from starlette.requests import Request
from starlette.responses import Response

from activator.errors import (
    ActivatorUnavailableError,
    ClientClosedError,
    ForbiddenModelError,
    ModelNotRegisteredError,
    QuotaExceededError,
    RequestTooLargeError,
    SequenceLostError,
    TooManyRequestsError,
    UnauthenticatedError,
    UnroutableRequestError,
    UpstreamError,
    UpstreamTimeoutError,
)
from foundation.errors import ModelFailedError, ZeroserveError
from foundation.http import (
    error_response,
    status_for as _status_for,
)

logger = logging.getLogger(__name__)

CLIENT_CLOSED = 499
"""nginx's "client closed request": not a server error (no 5xx alert), and never read."""

_STATUS: dict[type[BaseException], int] = {
    ClientClosedError: CLIENT_CLOSED,
    RequestTooLargeError: 413,
    UnroutableRequestError: 400,
    UnauthenticatedError: 401,
    ForbiddenModelError: 403,
    ModelNotRegisteredError: 404,
    # Gone: the sequence's state is, and no retry of this request brings it back.
    SequenceLostError: 410,
    # Failed Dependency: the model's load fails for good. Not 5xx, 429 or 408, which
    # clients (the openai SDK, tritonclient users' loops) retry on their own.
    ModelFailedError: 424,
    TooManyRequestsError: 429,
    ActivatorUnavailableError: 503,
    UpstreamError: 502,
    UpstreamTimeoutError: 504,
}


def status_for(error: ZeroserveError) -> int:
    """The HTTP status of ``error``: the nearest class in its MRO with a mapping, else 500."""
    return _status_for(error, _STATUS)


def _headers(error: ZeroserveError) -> dict[str, str] | None:
    if isinstance(error, TooManyRequestsError | ActivatorUnavailableError):
        return {"Retry-After": str(error.retry_after_s)}
    if isinstance(error, UnauthenticatedError):
        return {"WWW-Authenticate": "Bearer"}
    return None


def _openai_code(error: ZeroserveError) -> str | None:
    if isinstance(error, ModelNotRegisteredError):
        return "model_not_found"
    if isinstance(error, UnauthenticatedError):
        return "invalid_api_key"
    if isinstance(error, ForbiddenModelError):
        return "permission_denied"
    if isinstance(error, QuotaExceededError):
        return "rate_limit_exceeded"
    if isinstance(error, ModelFailedError):
        return "model_failed"
    return None


def from_error(error: ZeroserveError) -> Response:
    return error_response(error.message, status_for(error), _headers(error))


def openai_from_error(error: ZeroserveError) -> Response:
    """``error`` as OpenAI's body: ``{"error": {"message", "type", "param", "code"}}``."""
    status = status_for(error)
    is_unknown = isinstance(error, ModelNotRegisteredError)
    body = {
        "error": {
            "message": error.message,
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": "model" if is_unknown else None,
            "code": _openai_code(error),
        }
    }
    return Response(
        orjson.dumps(body),
        status_code=status,
        media_type="application/json",
        headers=_headers(error),
    )


async def handle_zeroserve_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ZeroserveError)
    return from_error(exc)
