"""Running the data plane under uvicorn with Triton-like graceful shutdown."""

from __future__ import annotations

import logging
import os
import signal

from data_plane.app import build_node_cache, build_repository, create_app
from data_plane.devices import cuda_device_count
from data_plane.metrics import Metrics
from data_plane.settings import DataPlaneSettings
from data_plane.state import Lifecycle
from foundation.http import DrainingServer, http_config

logger = logging.getLogger(__name__)


def run(settings: DataPlaneSettings) -> None:
    """Serve until a signal stops the server."""
    gpus = settings.gpu_count if settings.gpu_count is not None else cuda_device_count()
    metrics = Metrics()
    lifecycle = Lifecycle()
    cache = build_node_cache(settings, metrics)
    repository = build_repository(settings, metrics, cache, gpu_count=gpus)
    app = create_app(
        settings,
        repository,
        cache,
        metrics,
        lifecycle,
        # SIGTERM to ourselves: the same graceful stop as from the supervisor.
        on_engine_dead=lambda: os.kill(os.getpid(), signal.SIGTERM),
    )
    config = http_config(
        app,
        settings,
        host=settings.host,
        port=settings.http_port,
        loop="auto",
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        log_config=None,
        timeout_graceful_shutdown=max(int(settings.exit_timeout_s), 1),
        backlog=2048,
    )
    server = DrainingServer(config, lifecycle, settings.readiness_propagation_s)
    server.run()
