"""The data plane's ASGI application factory."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute

from data_plane import http_errors
from data_plane.errors import ZeroserveError
from data_plane.handlers import Handlers
from data_plane.log_settings import LogControl
from data_plane.metrics import Metrics
from data_plane.model_calls import ModelCalls
from data_plane.openai import routes as openai_routes
from data_plane.poll import open_poller
from data_plane.repository import LoadedVersion, ModelRepository, RepositorySettings
from data_plane.response_cache import ResponseCache
from data_plane.routes import (
    generate,
    infer,
    log_settings,
    metrics,
    models,
    repository,
    server,
    shared_memory,
    trace,
)
from data_plane.routes.state import ServerState
from data_plane.settings import DataPlaneSettings, ModelControlMode
from data_plane.state import Lifecycle, is_explicit
from data_plane.storage import CacheSettings, NodeCache, parse_storage_uri
from data_plane.trace import TraceManager
from foundation.http import handle_http_exception, handle_unexpected
from runtimes.base import RuntimeOptions
from runtimes.registry import RuntimeFactory

logger = logging.getLogger(__name__)


def build_node_cache(settings: DataPlaneSettings, metrics_: Metrics) -> NodeCache:
    """The node-local model cache ``settings`` describe, its metrics on ``metrics_``."""
    return NodeCache(
        CacheSettings(
            root=settings.cache_dir,
            max_bytes=settings.cache_max_bytes,
            part_size_bytes=settings.storage_part_size_bytes,
            concurrency=settings.storage_concurrency,
            connect_timeout_s=settings.storage_connect_timeout_s,
            read_timeout_s=settings.storage_read_timeout_s,
            lock_timeout_s=settings.storage_lock_timeout_s,
        ),
        registry=metrics_.registry,
    )


def build_response_cache(settings: DataPlaneSettings) -> ResponseCache | None:
    """The server's response cache, or None when ``settings`` give it no size."""
    if not settings.response_cache_bytes:
        return None
    return ResponseCache(settings.response_cache_bytes)


def build_repository(
    settings: DataPlaneSettings,
    metrics_: Metrics,
    cache: NodeCache,
    *,
    gpu_count: int,
    response_cache: ResponseCache | None = None,
) -> ModelRepository:
    """The repository for ``settings``, reporting loads and unloads to ``metrics_``, its
    models answering from ``response_cache`` where their config asks for it.

    Raises StorageError when the model repository URI is malformed.
    """
    root = settings.model_repository
    if "://" not in root:
        root = str(Path(root).resolve())
    allowed = (root, *settings.allowed_storage)

    def on_load(model: LoadedVersion) -> None:
        metrics_.model_loads.labels(model.name, "success").inc()
        metrics_.model_load_seconds.labels(model.name).observe(model.load_duration_s)
        generation_metrics = model.capabilities.generation_metrics
        if generation_metrics is not None:
            generation_metrics.observer = metrics_.llm.observer(model.name)

    def on_unload(model: LoadedVersion) -> None:
        metrics_.model_unloads.labels(model.name).inc()

    # Python models call the server's models (BLS) through it once the repository exists.
    calls = ModelCalls()
    repository = ModelRepository(
        RepositorySettings(
            root=parse_storage_uri(root, allowed=allowed),
            allowed_storage=allowed,
            gpu_count=gpu_count,
            batcher_queue_bound=settings.batcher_queue_bound,
            drain_timeout_s=settings.exit_timeout_s,
            warmup_timeout_s=settings.model_warmup_timeout_s,
        ),
        cache,
        RuntimeFactory.for_server(
            RuntimeOptions(
                cache_dir=settings.cache_dir,
                intra_op_threads=settings.intra_op_threads,
                inter_op_threads=settings.inter_op_threads,
                drain_timeout_s=settings.exit_timeout_s,
                models=calls,
                custom_metrics=metrics_.custom,
            )
        ),
        on_load=on_load,
        on_unload=on_unload,
        on_sleep=metrics_.llm.transition,
        response_cache=response_cache,
    )
    calls.attach(repository)
    return repository


async def load_startup_models(settings: DataPlaneSettings, repo: ModelRepository) -> None:
    """Mode none loads every model; explicit mode loads the ``--load-model`` names."""
    if settings.model_control_mode is ModelControlMode.NONE or "*" in settings.load_models:
        names = await repo.model_names_on_disk()
    else:
        names = list(settings.load_models)
    repo.require(names)
    for name in names:
        try:
            await repo.load(name)
        except ZeroserveError as exc:
            # Like Triton with --exit-on-error=false: the server starts, and strict
            # readiness keeps it not ready until the model loads or is unloaded.
            logger.error("failed to load model %s at start: %s", name, exc.message)


async def watch_engines(
    repo: ModelRepository,
    lifecycle: Lifecycle,
    interval_s: float,
    on_engine_dead: Callable[[], None] | None,
) -> None:
    """Fail readiness and call ``on_engine_dead`` (the server exits) once an LLM engine
    died for good (STYLE C15): its requests can only fail, and a new process recovers it."""
    while True:
        await asyncio.sleep(interval_s)
        dead = [
            m.name
            for m in repo.all_serving()
            if m.capabilities.health is not None and m.capabilities.health.is_dead
        ]
        if dead:
            logger.error("the engine of %s died; stopping the server to be replaced", dead)
            lifecycle.is_stopping = True
            if on_engine_dead is not None:
                on_engine_dead()
            return


def handlers_of(app: Starlette) -> Handlers:
    """The handlers ``app``'s lifespan built, while it runs: another transport of the same
    server (gRPC) serves with them, so both share one state (shared-memory regions, trace
    and log settings)."""
    handlers: Handlers = app.state.handlers
    return handlers


def create_app(
    settings: DataPlaneSettings,
    repo: ModelRepository,
    cache: NodeCache,
    metrics_: Metrics,
    lifecycle: Lifecycle | None = None,
    *,
    on_engine_dead: Callable[[], None] | None = None,
) -> Starlette:
    """The Starlette app serving ``repo``; its lifespan loads start-up models, watches LLM
    engines (``on_engine_dead`` is called when one dies; readiness fails either way) and,
    at shutdown, drains and unloads every model and closes the node cache."""
    lifecycle = lifecycle or Lifecycle()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[ServerState]:
        await load_startup_models(settings, repo)
        # Poll mode loads what the repository holds here, and follows its changes from now on.
        poller = await open_poller(settings, repo, repo.root)
        watchdog = asyncio.create_task(
            watch_engines(repo, lifecycle, settings.engine_watchdog_interval_s, on_engine_dead),
            name="engine-watchdog",
        )
        tracing = TraceManager(settings)
        log_control = LogControl()
        handlers = Handlers.create(
            repo,
            lifecycle,
            metrics_,
            is_explicit=is_explicit(settings),
            tracing=tracing,
            log_control=log_control,
            server_id=settings.server_id,
        )
        # For the server's other transports (gRPC), which serve with the same handlers.
        app.state.handlers = handlers
        try:
            yield ServerState(
                settings=settings,
                repository=repo,
                metrics=metrics_,
                lifecycle=lifecycle,
                handlers=handlers,
            )
        finally:
            lifecycle.is_stopping = True
            if poller is not None:
                await poller.close()
            watchdog.cancel()
            await asyncio.gather(watchdog, return_exceptions=True)
            try:
                await repo.close()
            finally:
                handlers.close()
                # After the drain: the last requests' traces are written too.
                await tracing.close(timeout_s=settings.exit_timeout_s)
                log_control.close()
                await cache.close()

    route_table: list[BaseRoute] = [
        *infer.routes,
        *generate.routes,
        *openai_routes.routes,
        *server.routes,
        *models.routes,
        *repository.routes,
        *metrics.routes,
        *shared_memory.routes,
        *trace.routes,
        *log_settings.routes,
    ]
    # Infer requests are answered before Starlette's middleware stack (routes/infer.py).
    return infer.InferFirst(
        routes=route_table,
        lifespan=lifespan,
        exception_handlers={
            ZeroserveError: http_errors.handle_zeroserve_error,
            HTTPException: handle_http_exception,
            Exception: handle_unexpected,
        },
    )
