"""``GET /metrics``: Prometheus text, on the HTTP port and on a metrics port of its own
(Triton's ``--metrics-port``), unless the server's settings disallow metrics."""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from data_plane.handlers import ServerHandlers
from data_plane.settings import DataPlaneSettings

MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def metrics(request: Request) -> Response:
    settings: DataPlaneSettings = request.state.settings
    if not settings.allow_metrics:
        return PlainTextResponse("Not Found", status_code=404)
    handler: ServerHandlers = request.state.handlers.server
    return Response(handler.metrics_text(), media_type=MEDIA_TYPE)


routes = [Route("/metrics", metrics, methods=["GET"])]


def metrics_app(render: Callable[[], bytes]) -> Starlette:
    """The metrics port's app: ``GET /metrics`` answered with ``render()``, nothing else
    (404), as Triton's metrics server."""

    async def scrape(request: Request) -> Response:
        return Response(render(), media_type=MEDIA_TYPE)

    return Starlette(routes=[Route("/metrics", scrape, methods=["GET"])])
