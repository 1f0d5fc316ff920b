"""Per-model read paths: metadata, ready, config and statistics."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from data_plane.handlers import ModelHandlers
from data_plane.handlers.models import TensorMetadata
from foundation import model_config


def path_version(request: Request) -> int | None:
    """The ``{version}`` path segment: ASCII digits only, as Triton's route regex requires."""
    raw = request.path_params.get("version")
    if raw is None:
        return None
    if not model_config.is_version(raw):
        raise HTTPException(404)
    return int(raw)


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


def _handler(request: Request) -> ModelHandlers:
    handler: ModelHandlers = request.state.handlers.models
    return handler


def _tensors(tensors: tuple[TensorMetadata, ...]) -> list[dict[str, Any]]:
    return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in tensors]


async def metadata(request: Request) -> Response:
    meta = _handler(request).metadata(request.path_params["name"], path_version(request))
    return _json(
        {
            "name": meta.name,
            "versions": list(meta.versions),
            "platform": meta.platform,
            "inputs": _tensors(meta.inputs),
            "outputs": _tensors(meta.outputs),
        }
    )


async def ready(request: Request) -> Response:
    if not _handler(request).ready(request.path_params["name"], path_version(request)):
        return Response(
            orjson.dumps({"error": "Model version not ready"}),
            status_code=400,
            media_type="application/json",
        )
    return Response(status_code=200)


async def config(request: Request) -> Response:
    config = _handler(request).config(request.path_params["name"], path_version(request))
    return _json(model_config.to_json(config))


async def stats(request: Request) -> Response:
    records = _handler(request).stats(request.path_params.get("name"), path_version(request))
    return _json(
        {"model_stats": [r.stats.to_json(name=r.name, version=r.version) for r in records]}
    )


routes = [
    Route("/v2/models/stats", stats, methods=["GET"]),
    Route("/v2/models/{name}", metadata, methods=["GET"]),
    Route("/v2/models/{name}/versions/{version}", metadata, methods=["GET"]),
    Route("/v2/models/{name}/ready", ready, methods=["GET"]),
    Route("/v2/models/{name}/versions/{version}/ready", ready, methods=["GET"]),
    Route("/v2/models/{name}/config", config, methods=["GET"]),
    Route("/v2/models/{name}/versions/{version}/config", config, methods=["GET"]),
    Route("/v2/models/{name}/stats", stats, methods=["GET"]),
    Route("/v2/models/{name}/versions/{version}/stats", stats, methods=["GET"]),
]
