"""``GET /metrics``: Prometheus text."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


async def metrics(request: Request) -> Response:
    body = request.state.metrics.render(request.state.repository.all_serving())
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


routes = [Route("/metrics", metrics, methods=["GET"])]
