"""The inference service's gRPC-Web calls on the HTTP listener: what the activator sends a
worker's unary calls as (one HTTP/1.1 request on a pooled connection), and what a browser
or any gRPC-Web client may call. The calls are served by the same handlers, limits and
statistics as the gRPC listener's."""

from __future__ import annotations

from typing import Final

from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from data_plane.app import handlers_of
from data_plane.grpc.server import create_grpc_app
from data_plane.grpc.servicer import SERVICE
from foundation.grpc_front.web import GrpcWebApp, is_grpc_web
from foundation.grpc_limits import GrpcLimits

__all__ = ["WithGrpcWeb"]

_PREFIX: Final = f"/{SERVICE}/"


class WithGrpcWeb:
    """``app`` with the inference service's gRPC-Web calls (``POST /<service>/<method>``
    with a gRPC-Web content type) taken before it, under ``limits``."""

    def __init__(self, app: Starlette, limits: GrpcLimits) -> None:
        self._app = app
        self._limits = limits
        self._web: GrpcWebApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(_PREFIX) and is_grpc_web(scope):
            if self._web is None:
                # The handlers exist once the app's lifespan has run, before any request.
                self._web = GrpcWebApp(create_grpc_app(handlers_of(self._app), self._limits))
            await self._web(scope, receive, send)
            return
        await self._app(scope, receive, send)
