"""A data plane with a response cache, in process: its HTTP app (lifespan run explicitly,
requests through httpx's ASGI transport), its repository, and a gRPC listener on a free
loopback port over the same handlers, on the test's event loop."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
from starlette.types import Receive, Scope, Send

from data_plane.app import (
    build_node_cache,
    build_repository,
    build_response_cache,
    create_app,
    handlers_of,
)
from data_plane.grpc.server import create_grpc_server, start_grpc_server
from data_plane.metrics import Metrics
from data_plane.repository import ModelRepository
from data_plane.response_cache import ResponseCache
from data_plane.settings import DataPlaneSettings, ModelControlMode
from foundation.grpc_limits import GrpcLimits

GRPC_STOP_GRACE_S = 5.0


@dataclass
class CachedDataPlane:
    client: httpx.AsyncClient
    repository: ModelRepository
    response_cache: ResponseCache | None
    grpc_channel: grpc.aio.Channel


@contextlib.asynccontextmanager
async def cached_data_plane(
    repo: Path, cache_dir: Path, *, response_cache_bytes: int, load_models: tuple[str, ...]
) -> AsyncIterator[CachedDataPlane]:
    """The data plane serving ``load_models`` of ``repo`` with a response cache of
    ``response_cache_bytes`` (0: none), as ``zeroserve serve`` composes it; everything is
    stopped on exit."""
    settings = DataPlaneSettings(
        model_repository=str(repo),
        model_control_mode=ModelControlMode.EXPLICIT,
        load_models=load_models,
        cache_dir=cache_dir,
        gpu_count=0,
        exit_timeout_s=5.0,
        response_cache_bytes=response_cache_bytes,
    )
    response_cache = build_response_cache(settings)
    metrics = Metrics(response_cache=response_cache)
    cache = build_node_cache(settings, metrics)
    repository = build_repository(
        settings, metrics, cache, gpu_count=0, response_cache=response_cache
    )
    app = create_app(settings, repository, cache, metrics)
    async with app.router.lifespan_context(app) as state:

        async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
            scope["state"] = dict(state or {})
            await app(scope, receive, send)

        server = create_grpc_server(handlers_of(app), GrpcLimits())
        port = await start_grpc_server(server, "127.0.0.1", 0)
        try:
            async with (
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=with_state),
                    base_url="http://data-plane",
                    timeout=60.0,
                ) as client,
                grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
            ):
                yield CachedDataPlane(client, repository, response_cache, channel)
        finally:
            await server.stop(GRPC_STOP_GRACE_S)
