"""The admin API's routes: parse and validate, call ``AdminService``, encode the answer."""

from __future__ import annotations

import math
import time
from typing import Any, TypeVar

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from control_plane.api import keys, schemas
from control_plane.api.bodies import read_json
from control_plane.api.service import AdminService
from control_plane.errors import InvalidInputError, SchemaValidationError

__all__ = ["routes"]

_T = TypeVar("_T", bound=BaseModel)


def _service(request: Request) -> AdminService:
    service: AdminService = request.state.service
    return service


def _json(content: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type="application/json")


def _view(model: BaseModel, status: int = 200) -> Response:
    return _json(model.model_dump(mode="json"), status)


async def _body(request: Request) -> dict[str, Any]:
    return await read_json(request)


def _validate(model: type[_T], doc: dict[str, Any], request: Request) -> _T:
    context = {
        "allowed_storage": request.state.allowed_storage,
        "allow_model_code": request.state.allow_model_code,
    }
    try:
        return model.model_validate(doc, context=context)
    except ValidationError as exc:
        raise schemas.schema_error(exc) from None


async def list_models(request: Request) -> Response:
    return _view(await _service(request).list_models())


def _dry_run(request: Request) -> bool:
    value = request.query_params.get("dry_run", "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise InvalidInputError(f"dry_run must be true or false, not {value!r}")
    return value in ("true", "1")


async def create_model(request: Request) -> Response:
    dry_run = _dry_run(request)
    body = _validate(schemas.ModelCreate, await _body(request), request)
    view = await _service(request).register(body, dry_run=dry_run)
    return _view(view, 200 if dry_run else 201)


async def get_model(request: Request) -> Response:
    return _view(await _service(request).get(request.path_params["name"]))


async def update_model(request: Request) -> Response:
    dry_run = _dry_run(request)
    patch = _validate(schemas.ModelPatch, await _body(request), request)
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
    return _view(await _service(request).activations(request.path_params["name"]))


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
