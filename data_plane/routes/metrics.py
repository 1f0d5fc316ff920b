"""``GET /metrics``: Prometheus text."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from data_plane.handlers import ServerHandlers


async def metrics(request: Request) -> Response:
    handler: ServerHandlers = request.state.handlers.server
    return Response(handler.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")


routes = [Route("/metrics", metrics, methods=["GET"])]
