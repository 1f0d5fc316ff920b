"""Triton's generate extension on LLM runtimes: ``/v2/models/{name}[/versions/{v}]/generate``
and ``.../generate_stream``.

The body is a JSON object whose keys are the model's inputs (``text_input``, and optionally
``sampling_parameters`` as a JSON string and ``exclude_input_in_output``) plus ``id`` and
``parameters``; sampling parameters (OpenAI's names: max_tokens, temperature, top_p, stop,
seed) come from ``parameters`` or ``sampling_parameters``, as Triton's vLLM backend takes them.
``generate`` answers ``{"model_name", "model_version", ["id"], "text_output"}``, the prompt
followed by the completion unless ``exclude_input_in_output`` is true; ``generate_stream``
sends one such object per server-sent event with the new text only. Errors before the
stream are Triton's ``{"error"}`` bodies; one during the stream is a last ``{"error"}`` event.
A client that leaves aborts its generation.

Models that are not language models (Python-backend models, decoupled ones among them)
are served by :mod:`data_plane.routes.generate_tensors`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from data_plane.errors import InvalidArgumentError, ZeroserveError
from data_plane.handlers import GenerateHandler
from data_plane.handlers.generate import GenerateRequest, GenerateResponse
from data_plane.http_errors import from_error
from data_plane.llm import SSE_HEADERS, sse_event
from data_plane.routes.body import (
    ClientDisconnectedError,
    json_object,
    read_body,
    until_disconnected,
)
from data_plane.routes.generate_tensors import generate_tensors
from data_plane.routes.models import path_version
from runtimes.llm.base import DEFAULT_MAX_TOKENS, EXCLUDE_INPUT, SAMPLING_INPUT, TEXT_INPUT
from runtimes.sampling import sampling_from_mapping

logger = logging.getLogger(__name__)

_STREAM_PARAMETER = "stream"
"""Triton vLLM's request parameter choosing streaming; the path decides here."""


async def generate(request: Request) -> Response:
    return await _generate(request, is_stream=False)


async def generate_stream(request: Request) -> Response:
    return await _generate(request, is_stream=True)


async def _generate(request: Request, *, is_stream: bool) -> Response:
    handler: GenerateHandler = request.state.handlers.generate
    try:
        handler.check_accepting()  # before the version in the path is checked
        loaded = request.state.handlers.infer.model(
            request.path_params["name"], path_version(request)
        )
        if loaded.capabilities.generation is None:
            # Any other model takes its inputs by name (Triton's generate on tensors).
            body = await read_body(request, request.state.settings.max_input_bytes)
            return await generate_tensors(request, loaded, json_object(body), is_stream=is_stream)
        model = handler.model(request.path_params["name"], path_version(request))
        body = await read_body(request, request.state.settings.max_input_bytes)
        generate_request = _decode(json_object(body))
        if is_stream:
            events = await until_disconnected(
                request.receive, handler.generate_stream(model, generate_request)
            )
            return StreamingResponse(
                _sse(events, model.version.name),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )
        answer = await until_disconnected(
            request.receive, handler.generate(model, generate_request)
        )
    except ClientDisconnectedError:
        return Response(status_code=499)
    except ZeroserveError as exc:
        return from_error(exc)
    return Response(orjson.dumps(_json(answer)), media_type="application/json")


def _decode(doc: dict[str, Any]) -> GenerateRequest:
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidArgumentError("'id' must be a string")
    unknown = set(doc) - {TEXT_INPUT, SAMPLING_INPUT, EXCLUDE_INPUT, "id", "parameters"}
    if unknown:
        raise InvalidArgumentError(f"unexpected inference input '{sorted(unknown)[0]}'")
    prompt = doc.get(TEXT_INPUT)
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidArgumentError(f"expected a string for input '{TEXT_INPUT}'")
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidArgumentError("'parameters' must be a JSON object")
    sampling = dict(parameters)
    sampling.pop(_STREAM_PARAMETER, None)
    raw = doc.get(SAMPLING_INPUT)
    if raw is not None:
        if not isinstance(raw, str):
            raise InvalidArgumentError(f"'{SAMPLING_INPUT}' must be a JSON string")
        try:
            extra = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidArgumentError(f"'{SAMPLING_INPUT}' is not valid JSON: {exc}") from None
        if not isinstance(extra, dict):
            raise InvalidArgumentError(f"'{SAMPLING_INPUT}' must hold a JSON object")
        sampling.update(extra)
    exclude = doc.get(EXCLUDE_INPUT, False)
    if not isinstance(exclude, bool):
        raise InvalidArgumentError(f"'{EXCLUDE_INPUT}' must be a boolean")
    params = sampling_from_mapping(sampling, default_max_tokens=DEFAULT_MAX_TOKENS)
    return GenerateRequest(prompt=prompt, sampling=params, exclude_input=exclude, id=request_id)


def _json(answer: GenerateResponse) -> dict[str, Any]:
    doc: dict[str, Any] = {"model_name": answer.model_name, "model_version": answer.model_version}
    if answer.id is not None:
        doc["id"] = answer.id
    doc["text_output"] = answer.text_output
    return doc


async def _sse(events: AsyncGenerator[GenerateResponse, None], name: str) -> AsyncIterator[bytes]:
    # The status line has gone: an error becomes the stream's last event.
    try:
        async with contextlib.aclosing(events) as stream:
            async for event in stream:
                yield sse_event(_json(event))
    except ZeroserveError as exc:
        logger.warning("generate_stream of %s failed: %s", name, exc.message)
        yield sse_event({"error": exc.message})
    except Exception:
        logger.exception("generate_stream of %s failed", name)
        yield sse_event({"error": "internal server error"})


routes = [
    Route("/v2/models/{name}/generate", generate, methods=["POST"]),
    Route("/v2/models/{name}/versions/{version}/generate", generate, methods=["POST"]),
    Route("/v2/models/{name}/generate_stream", generate_stream, methods=["POST"]),
    Route(
        "/v2/models/{name}/versions/{version}/generate_stream", generate_stream, methods=["POST"]
    ),
]
