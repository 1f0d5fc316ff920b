"""HTTP plumbing every zeroserve server shares: error bodies, status lookup, draining.

Each component keeps its own error table (its ``http_errors`` module); this module holds the
mechanics they have in common so that an error looks the same whichever server answers it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from types import FrameType
from typing import Any, Protocol

import orjson
import uvicorn
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

logger = logging.getLogger(__name__)


def error_response(
    message: str,
    status: int,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Response:
    """The Open Inference Protocol error body ``{"error": "<message>", **extra}``, as JSON."""
    return Response(
        orjson.dumps({"error": message, **(extra or {})}),
        status_code=status,
        media_type="application/json",
        headers=dict(headers) if headers else None,
    )


def status_for(error: BaseException, table: Mapping[type[BaseException], int]) -> int:
    """The status of ``error``: that of the nearest class in its MRO in ``table``, else 500."""
    for cls in type(error).__mro__:
        status = table.get(cls)
        if status is not None:
            return status
    return 500


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's 404/405 (and other HTTP exceptions) as the JSON error body."""
    assert isinstance(exc, HTTPException)
    text = {404: "Not Found", 405: "Method Not Allowed"}.get(exc.status_code, exc.detail)
    return error_response(text, exc.status_code, dict(exc.headers or {}))


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    """Any other exception: a generic 500; the traceback goes only to the log."""
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response("internal server error", 500)


class Stoppable(Protocol):
    """What a draining server flips: readiness fails once ``is_stopping`` is set."""

    is_stopping: bool


class DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT: fail readiness, wait for it to propagate, then stop accepting.

    uvicorn then waits (bounded by its ``timeout_graceful_shutdown``) for in-flight
    requests, and the app's lifespan releases what the server holds.
    """

    def __init__(self, config: uvicorn.Config, lifecycle: Stoppable, propagation_s: float):
        super().__init__(config)
        self._lifecycle = lifecycle
        self._propagation_s = propagation_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._lifecycle.is_stopping or self._propagation_s <= 0:
            self._lifecycle.is_stopping = True
            super().handle_exit(sig, frame)
            return
        self._lifecycle.is_stopping = True
        logger.info("readiness failed; stopping in %.1f s", self._propagation_s)
        asyncio.get_running_loop().call_later(self._propagation_s, super().handle_exit, sig, frame)
