"""HTTP for the OpenAI surface: read and check the body, call ``serving``, encode the answer.

Errors use OpenAI's body (``{"error": {"message", "type", "param", "code"}}``) with the
status codes of the data plane's one table (``data_plane.http_errors``), except that a model
this server does not hold is 404 ``model_not_found``, as OpenAI answers it (Triton says 400).
A non-streamed request whose client leaves is cancelled, which aborts its generation; a
streamed one is cancelled by the streaming response when the client leaves.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from data_plane.errors import (
    InvalidParameterError,
    NotFoundError,
    ServerStoppingError,
    UnavailableError,
    UnknownModelError,
    ZeroserveError,
)
from data_plane.http_errors import status_for
from data_plane.llm import SSE_HEADERS, NotALanguageModelError
from data_plane.openai import serving
from data_plane.openai.protocol import error_body, parse_chat, parse_completion
from data_plane.repository import ModelRepository
from data_plane.routes.body import ClientDisconnectedError, read_body, until_disconnected

logger = logging.getLogger(__name__)


async def completions(request: Request) -> Response:
    return await _serve(request, lambda repo, body: serving.complete(repo, parse_completion(body)))


async def chat_completions(request: Request) -> Response:
    return await _serve(request, lambda repo, body: serving.chat(repo, parse_chat(body)))


async def list_models(request: Request) -> Response:
    return _json(serving.models(request.state.repository))


async def _serve(
    request: Request,
    handle: Callable[[ModelRepository, bytes], Awaitable[serving.Answer]],
) -> Response:
    try:
        if request.state.lifecycle.is_stopping:
            raise ServerStoppingError()
        body = await read_body(request, request.state.settings.max_input_bytes)
        answer = await until_disconnected(request.receive, handle(request.state.repository, body))
    except ClientDisconnectedError:
        return Response(status_code=499)  # nobody reads it; the generation was aborted
    except ZeroserveError as exc:
        return error_response(exc)
    if isinstance(answer, dict):
        return _json(answer)
    return StreamingResponse(answer, media_type="text/event-stream", headers=SSE_HEADERS)


def error_response(exc: ZeroserveError) -> Response:
    """OpenAI's error body for ``exc``, with its status."""
    param: str | None = None
    code: str | int | None = None
    if isinstance(exc, UnknownModelError):
        status, message = 404, f"The model `{exc.model}` does not exist."
        param, code = "model", "model_not_found"
    elif isinstance(exc, NotFoundError):
        status, message, param, code = 404, exc.message, "model", "model_not_found"
    else:
        status, message = status_for(exc), exc.message
        if isinstance(exc, InvalidParameterError):
            param, code = exc.param, exc.code
        elif isinstance(exc, NotALanguageModelError):
            param = "model"
    error_type = "invalid_request_error" if status < 500 else "server_error"
    headers = {}
    if isinstance(exc, UnavailableError):
        headers["Retry-After"] = str(exc.retry_after_s)
    return Response(
        orjson.dumps(error_body(message, error_type=error_type, param=param, code=code)),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


routes = [
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
]
