"""The one place where data plane errors become HTTP responses."""

from __future__ import annotations

import logging

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from data_plane.errors import (
    InternalError,
    InvalidArgumentError,
    ModelLoadError,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
    ZeroserveError,
)

logger = logging.getLogger(__name__)

_STATUS: tuple[tuple[type[ZeroserveError], int], ...] = (
    (InvalidArgumentError, 400),
    (ModelLoadError, 400),
    (NotFoundError, 404),
    (UnavailableError, 503),
    (UnsupportedError, 501),
    (InternalError, 500),
)


def status_for(error: ZeroserveError) -> int:
    """The HTTP status of ``error``: the first class in its MRO with a mapping."""
    for cls in type(error).__mro__:
        for mapped, status in _STATUS:
            if cls is mapped:
                return status
    return 500


def error_response(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    """Triton's error body: ``{"error": "<message>"}`` as application/json."""
    return Response(
        orjson.dumps({"error": message}),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def from_error(error: ZeroserveError) -> Response:
    status = status_for(error)
    headers: dict[str, str] = {}
    if isinstance(error, UnavailableError):
        headers["Retry-After"] = str(error.retry_after_s)
    if isinstance(error, UnsupportedError) and "compression" in error.message:
        headers["Accept-Encoding"] = "gzip, deflate"
    return error_response(error.message, status, headers)


async def handle_zeroserve_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ZeroserveError)
    return from_error(exc)


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    text = {404: "Not Found", 405: "Method Not Allowed"}.get(exc.status_code, exc.detail)
    return error_response(text, exc.status_code, dict(exc.headers or {}))


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response("internal server error", 500)
