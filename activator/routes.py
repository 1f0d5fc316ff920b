"""The activator's HTTP surface: health, metadata, metrics, and the model paths it proxies.

Model requests are routed by name (the path for V2, the body's ``"model"`` for the OpenAI
paths), refused with 404 for names nobody registered, and otherwise handed to the proxy
with their body untouched.
"""

from __future__ import annotations

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from activator.auth import admitted
from activator.errors import (
    ClientClosedError,
    ModelNotRegisteredError,
    RequestTooLargeError,
    UnroutableRequestError,
)
from activator.http_errors import openai_from_error
from activator.metadata import EXTENSIONS, SERVER_NAME, server_version
from activator.metrics import mark_model
from activator.placements import ModelCatalog
from activator.state import ActivatorState
from foundation.errors import ModelFailedError, ZeroserveError
from foundation.keys import allows_model

_ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
"""Model paths pass every method through (HEAD comes with GET); the worker decides."""


def _state(request: Request) -> ActivatorState:
    # Starlette copies the lifespan's state into every request's scope.
    state: ActivatorState = request.scope["state"]
    return state


async def live(request: Request) -> Response:
    return Response(status_code=200)


async def ready(request: Request) -> Response:
    # Triton's "not ready" is 400 with an empty body; the data plane answers the same.
    state = _state(request)
    is_ready = state["view"].is_synced and not state["lifecycle"].is_stopping
    return Response(status_code=200 if is_ready else 400)


async def metadata(request: Request) -> Response:
    body = {"name": SERVER_NAME, "version": server_version(), "extensions": list(EXTENSIONS)}
    return Response(orjson.dumps(body), media_type="application/json")


async def model_ready(request: Request) -> Response:
    """A registered model is servable through the activator even at zero replicas, so it
    is ready, unless its load failed for good; answered here, so that readiness polls
    neither wake nor keep a model warm. The key is checked first, so that a caller outside
    its scope learns nothing of the model."""
    state = _state(request)
    name: str = request.path_params["name"]
    state["gate"].authorize(admitted(request.scope), name)
    try:
        await _require(state["catalog"], name)
    except ModelFailedError:
        return Response(status_code=400)  # Triton's "not ready"
    return Response(status_code=200)


async def model_request(request: Request) -> Response:
    """Any other ``/v2/models/{name}[/...]`` path: infer, metadata, config, stats, ..."""
    state = _state(request)
    name: str = request.path_params["name"]
    state["gate"].authorize(admitted(request.scope), name)
    await _require(state["catalog"], name)
    mark_model(request.scope, name)
    body = await _read_body(request, state["settings"].max_request_bytes)
    await _charge_activation(request, state, name)
    return await state["proxy"].forward(name, request.scope, request.receive, body)


async def openai_request(request: Request) -> Response:
    """``/v1/completions`` and ``/v1/chat/completions``: the model is the body's ``"model"``.

    The activator's own errors (unknown model, full buffer, failed activation) take
    OpenAI's error body here, so that OpenAI clients read them like the workers' errors.
    """
    try:
        return await _openai_request(request)
    except ZeroserveError as exc:
        return openai_from_error(exc)


async def _openai_request(request: Request) -> Response:
    state = _state(request)
    encoding = request.headers.get("content-encoding", "identity")
    if encoding != "identity":
        # Routing needs the "model" field; decompressing bodies to find it is not worth it
        # for a protocol whose clients do not compress requests.
        raise UnroutableRequestError(f"Content-Encoding '{encoding}' is not supported on this path")
    body = await _read_body(request, state["settings"].max_request_bytes)
    name = _openai_model(body)
    state["gate"].authorize(admitted(request.scope), name)
    await _require(state["catalog"], name)
    mark_model(request.scope, name)
    await _charge_activation(request, state, name)
    return await state["proxy"].forward(name, request.scope, request.receive, body)


async def openai_models(request: Request) -> Response:
    """The registered models the request's key may call."""
    records = await _state(request)["catalog"].list_models()
    key = admitted(request.scope).key
    data = [
        {"id": r.name, "object": "model", "created": int(r.created_at), "owned_by": "zeroserve"}
        for r in records
        if key is None or allows_model(key.models, r.name)
    ]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


async def metrics(request: Request) -> Response:
    registry = _state(request)["metrics"].registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def _charge_activation(request: Request, state: ActivatorState, name: str) -> None:
    """Spend one of the key's activations when this request would start ``name``."""
    await state["gate"].activation(admitted(request.scope), name, state["proxy"].would_activate)


async def _require(catalog: ModelCatalog, name: str) -> None:
    is_known = catalog.cached(name)
    if is_known is None:
        is_known = await catalog.is_registered(name)
    if not is_known:
        raise ModelNotRegisteredError(model=name)
    failure = catalog.failure(name)
    if failure is not None:
        raise ModelFailedError(model=name, reason=failure.reason, failed_at=failure.failed_at)


async def _read_body(request: Request, max_bytes: int) -> bytes:
    """The whole body (kept to retry on another replica), refusing one over ``max_bytes``.

    Raises:
        RequestTooLargeError: the body is over ``max_bytes``.
        ClientClosedError: the client disconnected before the body's end.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise RequestTooLargeError(size=int(declared), limit=max_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise RequestTooLargeError(size=size, limit=max_bytes)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientClosedError(path=request.url.path) from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _openai_model(body: bytes) -> str:
    """The ``"model"`` field of an OpenAI request body. The body is decoded only to read it;
    what goes upstream is the original bytes."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise UnroutableRequestError(f"request body is not valid JSON: {exc}") from None
    model = document.get("model") if isinstance(document, dict) else None
    if not isinstance(model, str) or not model:
        raise UnroutableRequestError('request body has no "model" string')
    return model


routes: list[BaseRoute] = [
    Route("/v2", metadata, methods=["GET"]),
    Route("/v2/health/live", live, methods=["GET"]),
    Route("/v2/health/ready", ready, methods=["GET"]),
    Route("/v2/models/{name}/ready", model_ready, methods=["GET"]),
    Route("/v2/models/{name}/versions/{version}/ready", model_ready, methods=["GET"]),
    Route("/v2/models/{name}", model_request, methods=_ANY_METHOD),
    Route("/v2/models/{name}/{rest:path}", model_request, methods=_ANY_METHOD),
    Route("/v1/models", openai_models, methods=["GET"]),
    Route("/v1/completions", openai_request, methods=["POST"]),
    Route("/v1/chat/completions", openai_request, methods=["POST"]),
    Route("/metrics", metrics, methods=["GET"]),
]
"""Matched in order: the local ``ready`` answers come before the catch-all model paths."""
