"""Server health and metadata: ``/v2``, ``/v2/health/live``, ``/v2/health/ready``."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

EXTENSIONS = (
    "classification",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
)
"""Triton's extension names for what this server implements, in Triton's order."""


def _version() -> str:
    try:
        return version("zeroserve")
    except PackageNotFoundError:
        return "0.0.0"


async def live(request: Request) -> Response:
    return Response(status_code=200)


async def ready(request: Request) -> Response:
    # Triton answers 400 with an empty body for "not ready", and so do we.
    lifecycle = request.state.lifecycle
    is_ready = not lifecycle.is_stopping and request.state.repository.is_ready()
    return Response(status_code=200 if is_ready else 400)


async def metadata(request: Request) -> Response:
    body = {"name": "zeroserve", "version": _version(), "extensions": list(EXTENSIONS)}
    return Response(orjson.dumps(body), media_type="application/json")


routes = [
    Route("/v2", metadata, methods=["GET"]),
    Route("/v2/health/live", live, methods=["GET"]),
    Route("/v2/health/ready", ready, methods=["GET"]),
]
