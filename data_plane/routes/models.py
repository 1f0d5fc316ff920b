"""Per-model read paths: metadata, ready, config and statistics."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from data_plane.errors import (
    InvalidArgumentError,
    ModelNotReadyError,
    NotFoundError,
    UnknownModelError,
)
from data_plane.repository import LoadedVersion, ModelRepository
from foundation.model_config import is_version


def path_version(request: Request) -> int | None:
    """The ``{version}`` path segment: ASCII digits only, as Triton's route regex requires."""
    raw = request.path_params.get("version")
    if raw is None:
        return None
    if not is_version(raw):
        raise HTTPException(404)
    return int(raw)


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


async def metadata(request: Request) -> Response:
    repository: ModelRepository = request.state.repository
    name = request.path_params["name"]
    version = path_version(request)
    model = repository.get(name, version)
    body = dict(model.metadata)
    if version is None:
        body["versions"] = [str(m.version) for m in repository.serving_versions(name)]
    return _json(body)


async def ready(request: Request) -> Response:
    repository: ModelRepository = request.state.repository
    try:
        repository.get(request.path_params["name"], path_version(request))
    except ModelNotReadyError:
        return Response(
            orjson.dumps({"error": "Model version not ready"}),
            status_code=400,
            media_type="application/json",
        )
    return Response(status_code=200)


async def config(request: Request) -> Response:
    repository: ModelRepository = request.state.repository
    model = repository.get(request.path_params["name"], path_version(request))
    return _json(model.config_json)


async def stats(request: Request) -> Response:
    repository: ModelRepository = request.state.repository
    name = request.path_params.get("name")
    version = path_version(request)
    models: list[LoadedVersion]
    if name is None:
        models = list(repository.all_serving())
    else:
        try:
            models = (
                [repository.get(name, version)]
                if version is not None
                else repository.serving_versions(name)
            )
        except UnknownModelError:
            raise InvalidArgumentError(f"requested model '{name}' is not available") from None
        except NotFoundError:
            raise InvalidArgumentError(
                f"requested model version is not available for model '{name}'"
            ) from None
        if not models:
            raise InvalidArgumentError(f"requested model '{name}' is not available")
    return _json({"model_stats": [m.stats.to_json(name=m.name, version=m.version) for m in models]})


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
