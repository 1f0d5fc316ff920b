"""Triton's generate extension on models that are not language models (Python-backend
models, decoupled or not): the JSON body's keys that name the model's inputs are its
inputs, in the shapes the model's config gives them; ``id`` and ``parameters`` are the
request's; other keys are parameters too. Each response is a JSON object of the outputs
(an output of one element as that value, a larger one as a flat list) beside
``model_name``, ``model_version`` and the request's ``id``, keys in order, as Triton
writes it.

``generate`` answers with the model's one response; a decoupled model that sends any
other number gets Triton's 200 with an ``{"error"}`` body. ``generate_stream`` sends
each response as a server-sent event, an error as the last event; a model whose first
response is an error (its ``execute`` raised) answers 400 with that event. A client
that leaves cancels the request (the model's ``is_cancelled`` turns true).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from data_plane.errors import InvalidArgumentError, ZeroserveError
from data_plane.handlers.infer import InferHandler
from data_plane.http_errors import from_error
from data_plane.llm import SSE_HEADERS, sse_event
from data_plane.protocol import InferInput, InferRequest, OutputTensor
from data_plane.repository import LoadedVersion
from data_plane.response_stream import ResponseStream, StreamedAnswer
from data_plane.routes.body import ClientDisconnectedError, until_disconnected
from foundation.datatypes import NUMPY_DTYPES

_COUNT_ERROR = (
    "generate expects model to produce exactly 1 response, use generate stream for model "
    "that generates various number of responses"
)


async def generate_tensors(
    request: Request, model: LoadedVersion, doc: dict[str, Any], *, is_stream: bool
) -> Response:
    """Answer a generate request for ``model`` (not a language model), its body ``doc``."""
    handler: InferHandler = request.state.handlers.infer
    try:
        infer_request = _decode(model, doc)
        if model.config.model_transaction_policy.decoupled:
            stream = handler.stream(model, infer_request)
        else:
            stream = None
        if is_stream:
            first = await until_disconnected(
                request.receive, _first(model, handler, infer_request, stream)
            )
            status = 400 if first.error is not None else 200
            return StreamingResponse(
                _events(model, infer_request, first, stream),
                status_code=status,
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )
        if stream is None:
            answer = await until_disconnected(request.receive, handler.infer(model, infer_request))
            return _json(_document(model, infer_request, answer.outputs))
        return await until_disconnected(request.receive, _one(model, infer_request, stream))
    except ClientDisconnectedError:
        return Response(status_code=499)
    except ZeroserveError as exc:
        return from_error(exc)


async def _first(
    model: LoadedVersion,
    handler: InferHandler,
    request: InferRequest,
    stream: ResponseStream | None,
) -> StreamedAnswer:
    if stream is None:
        try:
            answer = await handler.infer(model, request)
        except ZeroserveError as exc:
            return StreamedAnswer([], exc, True)
        return StreamedAnswer(answer.outputs, None, True)
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return StreamedAnswer([], None, True)
    except BaseException:
        await stream.aclose()
        raise


async def _events(
    model: LoadedVersion,
    request: InferRequest,
    first: StreamedAnswer,
    stream: ResponseStream | None,
) -> AsyncIterator[bytes]:
    # Closing the stream, also when the client leaves, cancels the request.
    try:
        answer: StreamedAnswer | None = first
        while answer is not None:
            if answer.error is not None:
                yield sse_event({"error": answer.error.message})
                return
            if answer.outputs or not answer.is_final:
                yield sse_event(_document(model, request, answer.outputs))
            if answer.is_final or stream is None:
                return
            answer = await anext(stream, None)
    finally:
        if stream is not None:
            await stream.aclose()


async def _one(model: LoadedVersion, request: InferRequest, stream: ResponseStream) -> Response:
    """A decoupled model's generate: exactly one response with outputs, or Triton's
    200 error."""
    answers: list[StreamedAnswer] = []
    async with contextlib.aclosing(stream):
        async for answer in stream:
            if answer.error is not None:
                if not answers:
                    return from_error(_as_request_error(answer.error))
                break
            if answer.outputs or not answer.is_final:
                answers.append(answer)
    if len(answers) != 1:
        return Response(orjson.dumps({"error": _COUNT_ERROR}), media_type="application/json")
    return _json(_document(model, request, answers[0].outputs))


def _as_request_error(error: ZeroserveError) -> ZeroserveError:
    # Triton answers a failed execution of generate 400, whatever the error's kind.
    return error if isinstance(error, InvalidArgumentError) else InvalidArgumentError(error.message)


def _json(doc: dict[str, Any]) -> Response:
    return Response(orjson.dumps(doc), media_type="application/json")


def _decode(model: LoadedVersion, doc: dict[str, Any]) -> InferRequest:
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidArgumentError("'id' must be a string")
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidArgumentError("'parameters' must be a JSON object")
    parameters = dict(parameters)
    inputs = []
    for key, value in doc.items():
        if key in ("id", "parameters"):
            continue
        spec = model.inputs.get(key)
        if spec is None:
            if isinstance(value, bool | int | float | str):
                parameters[key] = value
            continue
        data = _tensor(key, value, spec.datatype, list(spec.dims), model.max_batch_size > 0)
        inputs.append(InferInput(key, spec.datatype, tuple(data.shape), data))
    return InferRequest(request_id, inputs, None, parameters, False, 0, 0)


def _tensor(name: str, value: Any, datatype: str, dims: list[int], batching: bool) -> np.ndarray:
    """``value`` (a scalar or nested lists) as the input's tensor, shaped by its dims."""
    shape = [1, *dims] if batching else dims
    try:
        if datatype == "BYTES":
            flat = np.asarray(value, dtype=object).reshape(-1)
            elements = [v.encode("utf-8") if isinstance(v, str) else v for v in flat.tolist()]
            if not all(isinstance(v, bytes) for v in elements):
                raise ValueError("not strings")
            data = np.empty(len(elements), dtype=object)
            data[:] = elements
        else:
            data = np.asarray(value, dtype=NUMPY_DTYPES[datatype]).reshape(-1)
        known = math.prod(d for d in shape if d >= 0)
        free = [i for i, d in enumerate(shape) if d < 0]
        if len(free) > 1 or (known == 0 and free) or (free and data.size % known):
            raise ValueError("ambiguous shape")
        if free:
            shape[free[0]] = data.size // known
        return data.reshape(shape)
    except (ValueError, TypeError, OverflowError):
        raise InvalidArgumentError(
            f"The schema can not convert input '{name}' to tensor with proper shape"
        ) from None


def _document(
    model: LoadedVersion, request: InferRequest, outputs: list[OutputTensor]
) -> dict[str, Any]:
    doc: dict[str, Any] = {"model_name": model.name, "model_version": str(model.version)}
    if request.id is not None:
        doc["id"] = request.id
    for output in outputs:
        values = output.data.reshape(-1).tolist()
        values = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in values]
        doc[output.name] = values[0] if len(values) == 1 else values
    return dict(sorted(doc.items()))
