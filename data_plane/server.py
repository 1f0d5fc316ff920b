"""Running the data plane under uvicorn with Triton-like graceful shutdown."""

from __future__ import annotations

import asyncio
import logging
from types import FrameType

import uvicorn

from data_plane.app import build_node_cache, build_repository, create_app
from data_plane.devices import cuda_device_count
from data_plane.metrics import Metrics
from data_plane.settings import DataPlaneSettings
from data_plane.state import Lifecycle

logger = logging.getLogger(__name__)


class _DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT: fail readiness, wait for it to propagate, then stop accepting.

    uvicorn then waits (bounded by ``timeout_graceful_shutdown``) for in-flight requests,
    and the app's lifespan drains the batchers and releases the engines.
    """

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, propagation_s: float):
        super().__init__(config)
        self._lifecycle = lifecycle
        self._propagation_s = propagation_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._lifecycle.is_stopping or self._propagation_s <= 0:
            self._lifecycle.is_stopping = True
            super().handle_exit(sig, frame)
            return
        self._lifecycle.is_stopping = True
        logger.info("readiness failed; stopping in %.1f s", self._propagation_s)
        asyncio.get_running_loop().call_later(self._propagation_s, super().handle_exit, sig, frame)


def run(settings: DataPlaneSettings) -> None:
    """Serve until a signal stops the server."""
    gpus = settings.gpu_count if settings.gpu_count is not None else cuda_device_count()
    metrics = Metrics()
    lifecycle = Lifecycle()
    cache = build_node_cache(settings, metrics)
    repository = build_repository(settings, metrics, cache, gpu_count=gpus)
    app = create_app(settings, repository, cache, metrics, lifecycle)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.http_port,
        loop="auto",
        http="auto",
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        log_config=None,
        timeout_graceful_shutdown=max(int(settings.exit_timeout_s), 1),
        backlog=2048,
    )
    server = _DrainingServer(config, lifecycle, settings.readiness_propagation_s)
    server.run()
