"""The admin API's routes: parse and validate, call ``AdminService``, encode the answer."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from control_plane.api import keys, schemas
from control_plane.api.bodies import read_json, validate
from control_plane.api.service import AdminService
from control_plane.errors import InvalidInputError, SchemaValidationError

__all__ = ["routes"]


def _service(request: Request) -> AdminService:
    service: AdminService = request.state.service
    return service


def _json(content: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type="application/json")


def _view(model: BaseModel, status: int = 200) -> Response:
    return _json(model.model_dump(mode="json"), status)


async def _body(request: Request) -> dict[str, Any]:
    return await read_json(request)


async def list_models(request: Request) -> Response:
    return _view(await _service(request).list_models())


def _dry_run(request: Request) -> bool:
    value = request.query_params.get("dry_run", "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise InvalidInputError(f"dry_run must be true or false, not {value!r}")
    return value in ("true", "1")


async def create_model(request: Request) -> Response:
    dry_run = _dry_run(request)
    body = validate(schemas.ModelCreate, await _body(request), request)
    view = await _service(request).register(body, dry_run=dry_run)
    return _view(view, 200 if dry_run else 201)


async def get_model(request: Request) -> Response:
    return _view(await _service(request).get(request.path_params["name"]))


async def update_model(request: Request) -> Response:
    dry_run = _dry_run(request)
    patch = validate(schemas.ModelPatch, await _body(request), request)
    return _view(
        await _service(request).update(request.path_params["name"], patch, dry_run=dry_run)
    )


async def delete_model(request: Request) -> Response:
    await _service(request).delete(request.path_params["name"])
    return Response(status_code=204)


async def load_model(request: Request) -> Response:
    view, is_done = await _service(request).load(request.path_params["name"])
    return _view(view, 200 if is_done else 202)


async def unload_model(request: Request) -> Response:
    return _view(await _service(request).unload(request.path_params["name"]))


async def model_activations(request: Request) -> Response:
    name = request.path_params["name"]
    if request.query_params.get("follow", "").lower() in ("1", "true", "yes"):
        return await follow_response(_service(request), name, request.query_params.get("wait_s"))
    return _view(await _service(request).activations(name))


_HEARTBEAT_S = 15.0
"""Quiet time after which a follow sends an SSE comment, so proxies keep the stream open."""


async def follow_response(service: AdminService, name: str, wait: str | None) -> Response:
    """Server-sent events of ``service.follow(name)``: an ``activation`` event (the timeline
    as JSON) per change, comments while nothing changes, and an ``end`` event. The stream
    stops when the follow ends, and is cancelled when the client goes away."""
    try:
        wait_s = float(wait) if wait is not None else _DEFAULT_FOLLOW_WAIT_S
    except ValueError:
        wait_s = math.nan
    if not math.isfinite(wait_s) or wait_s < 0:
        raise InvalidInputError(f"wait_s must be a number of seconds >= 0, got {wait!r}")
    updates = service.follow(name, wait_s=wait_s)
    # The first read happens before the status line, so an unknown model is still a 404.
    first = await anext(updates)

    async def events() -> AsyncIterator[bytes]:
        quiet_since = time.monotonic()
        try:
            batch: list[dict[str, Any]] | None = first
            while batch is not None:
                for timeline in batch:
                    yield b"event: activation\ndata: " + orjson.dumps(timeline) + b"\n\n"
                    quiet_since = time.monotonic()
                if time.monotonic() - quiet_since >= _HEARTBEAT_S:
                    yield b": still following\n\n"
                    quiet_since = time.monotonic()
                batch = await anext(updates, None)
            yield b"event: end\ndata: {}\n\n"
        finally:
            await updates.aclose()

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


_DEFAULT_FOLLOW_WAIT_S = 30.0
"""How long a follow waits for an activation to start when none is running."""


async def model_usage(request: Request) -> Response:
    end = _time_param(request, "end", time.time())
    start = _time_param(request, "start", end - 86400.0)
    if start > end:
        raise SchemaValidationError(errors=[("start", "after end")])
    return _view(await _service(request).usage(request.path_params["name"], start=start, end=end))


def _time_param(request: Request, key: str, default: float) -> float:
    raw = request.query_params.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SchemaValidationError(errors=[(key, "not seconds since the epoch")]) from None
    if not math.isfinite(value):
        raise SchemaValidationError(errors=[(key, "not finite")])
    return value


async def list_workers(request: Request) -> Response:
    return _view(await _service(request).workers())


async def openapi(request: Request) -> Response:
    return _json(request.state.openapi)


async def metrics(request: Request) -> Response:
    registry: CollectorRegistry = request.state.registry
    body = generate_latest(registry)
    workers = request.state.worker_metrics
    if workers is not None:
        # A family may appear once on a page: the workers' are left out where the platform
        # names the same family itself.
        own = {line.split()[2] for line in body.decode().splitlines() if line.startswith("# TYPE")}
        body += (await workers.exposition(exclude=own)).encode()
    return Response(body, media_type=CONTENT_TYPE_LATEST)


async def healthz(request: Request) -> Response:
    return _json({"live": True, "acting": request.state.acting.is_acting})


routes = [
    Route("/admin/v1/openapi.json", openapi, methods=["GET"]),
    Route("/admin/v1/models", list_models, methods=["GET"]),
    Route("/admin/v1/models", create_model, methods=["POST"]),
    Route("/admin/v1/models/{name}", get_model, methods=["GET"]),
    Route("/admin/v1/models/{name}", update_model, methods=["PATCH"]),
    Route("/admin/v1/models/{name}", delete_model, methods=["DELETE"]),
    Route("/admin/v1/models/{name}/load", load_model, methods=["POST"]),
    Route("/admin/v1/models/{name}/unload", unload_model, methods=["POST"]),
    Route("/admin/v1/models/{name}/activations", model_activations, methods=["GET"]),
    Route("/admin/v1/models/{name}/usage", model_usage, methods=["GET"]),
    Route("/admin/v1/workers", list_workers, methods=["GET"]),
    *keys.routes,
    Route("/metrics", metrics, methods=["GET"]),
    Route("/healthz", healthz, methods=["GET"]),
]
