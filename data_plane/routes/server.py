"""Server health and metadata: ``/v2``, ``/v2/health/live``, ``/v2/health/ready``."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from data_plane.handlers import ServerHandlers


async def live(request: Request) -> Response:
    handler: ServerHandlers = request.state.handlers.server
    return Response(status_code=200 if handler.live() else 400)


async def ready(request: Request) -> Response:
    # Triton answers 400 with an empty body for "not ready", and so do we.
    handler: ServerHandlers = request.state.handlers.server
    return Response(status_code=200 if handler.ready() else 400)


async def metadata(request: Request) -> Response:
    handler: ServerHandlers = request.state.handlers.server
    meta = handler.metadata()
    body = {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}
    return Response(orjson.dumps(body), media_type="application/json")


routes = [
    Route("/v2", metadata, methods=["GET"]),
    Route("/v2/health/live", live, methods=["GET"]),
    Route("/v2/health/ready", ready, methods=["GET"]),
]
