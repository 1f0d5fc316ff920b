"""A data plane serving the tiny test LLM, in process: through ASGI, or under uvicorn on a
free loopback port (where a client can really go away)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from data_plane.app import build_node_cache, build_repository, create_app
from data_plane.metrics import Metrics
from data_plane.repository import ModelRepository
from data_plane.settings import DataPlaneSettings, ModelControlMode

START_TIMEOUT_S = 30.0


@dataclass
class LlmServer:
    client: httpx.AsyncClient
    repository: ModelRepository
    metrics: Metrics


def _app(
    repo: Path, cache_dir: Path, models: tuple[str, ...], exit_timeout_s: float = 5.0
) -> tuple[Starlette, LlmServer]:
    settings = DataPlaneSettings(
        model_repository=str(repo),
        model_control_mode=ModelControlMode.EXPLICIT,
        load_models=models,
        cache_dir=cache_dir,
        gpu_count=0,
        exit_timeout_s=exit_timeout_s,
    )
    metrics = Metrics()
    cache = build_node_cache(settings, metrics)
    repository = build_repository(settings, metrics, cache, gpu_count=0)
    app = create_app(settings, repository, cache, metrics)
    return app, LlmServer(httpx.AsyncClient(), repository, metrics)


@contextlib.asynccontextmanager
async def llm_app(
    repo: Path, cache_dir: Path, models: tuple[str, ...] = ("tiny",), exit_timeout_s: float = 5.0
) -> AsyncIterator[LlmServer]:
    """The app in process, its lifespan run explicitly (httpx's ASGI transport runs none)."""
    app, server = _app(repo, cache_dir, models, exit_timeout_s)
    async with app.router.lifespan_context(app) as state:

        async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
            scope["state"] = dict(state or {})
            await app(scope, receive, send)

        transport = httpx.ASGITransport(app=with_state)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://data-plane", timeout=60.0
        ) as client:
            server.client = client
            yield server


@contextlib.asynccontextmanager
async def llm_server(
    repo: Path, cache_dir: Path, models: tuple[str, ...] = ("tiny",)
) -> AsyncIterator[LlmServer]:
    """The app under uvicorn on 127.0.0.1 (a free port), stopped on exit."""
    app, server = _app(repo, cache_dir, models)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_config=None)
    uv = uvicorn.Server(config)
    task = asyncio.create_task(uv.serve())
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while not uv.started:
                if task.done():
                    task.result()
                    raise RuntimeError("server stopped during start-up")
                await asyncio.sleep(0.01)
        port = uv.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60.0) as client:
            server.client = client
            yield server
    finally:
        uv.should_exit = True
        await task
