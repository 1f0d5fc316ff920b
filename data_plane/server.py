"""Running the data plane: its HTTP server, its gRPC server unless ``grpc_port`` is 0 and
its metrics server unless ``metrics_port`` is 0 (or metrics are disallowed), under the one
bootstrap (`foundation.serving`), with Triton-like graceful shutdown."""

from __future__ import annotations

import logging
import os
import signal
from contextlib import AbstractAsyncContextManager

from data_plane.app import (
    build_node_cache,
    build_repository,
    build_response_cache,
    create_app,
    handlers_of,
)
from data_plane.devices import cuda_device_count
from data_plane.grpc.server import check_port, grpc_listener
from data_plane.grpc.web import WithGrpcWeb
from data_plane.metrics import Metrics
from data_plane.routes.infer import DirectInfer
from data_plane.routes.metrics import metrics_app
from data_plane.settings import DataPlaneSettings
from data_plane.state import Lifecycle
from foundation import serving
from foundation.grpc_tls import load_server_tls
from foundation.serving import HttpListener, bind_socket

logger = logging.getLogger(__name__)


def run(settings: DataPlaneSettings) -> None:
    """Serve until a signal stops the server; a port in use raises OSError before the
    server starts, a failed start `ServerStartError`."""
    if settings.grpc_port:
        # TLS files that cannot be served fail before anything is bound or loaded (the
        # listener reads them again as it starts).
        load_server_tls(settings)
    gpus = settings.gpu_count if settings.gpu_count is not None else cuda_device_count()
    response_cache = build_response_cache(settings)
    metrics = Metrics(response_cache=response_cache)
    lifecycle = Lifecycle()
    cache = build_node_cache(settings, metrics)
    repository = build_repository(
        settings, metrics, cache, gpu_count=gpus, response_cache=response_cache
    )
    app = create_app(
        settings,
        repository,
        cache,
        metrics,
        lifecycle,
        # SIGTERM to ourselves: the same graceful stop as from the supervisor.
        on_engine_dead=lambda: os.kill(os.getpid(), signal.SIGTERM),
    )
    http = HttpListener(
        WithGrpcWeb(app, settings),
        settings,
        bind_socket(settings.host, settings.http_port),
        name="data plane",
        drain_timeout_s=settings.exit_timeout_s,
        direct=DirectInfer(),
        proxy_headers=False,
    )
    listeners: list[AbstractAsyncContextManager[object]] = [http]
    if settings.allow_metrics and settings.metrics_port:
        listeners.append(
            HttpListener(
                metrics_app(lambda: metrics.render(repository.all_serving())),
                settings,
                bind_socket(settings.host, settings.metrics_port),
                name="metrics",
                drain_timeout_s=settings.exit_timeout_s,
                proxy_headers=False,
            )
        )
    if settings.grpc_port:
        check_port(settings.host, settings.grpc_port)
        # Started after the HTTP listener, whose app builds the handlers both serve with.
        listeners.append(
            grpc_listener(
                lambda: handlers_of(app),
                settings,
                host=settings.host,
                port=settings.grpc_port,
                drain_timeout_s=settings.exit_timeout_s,
            )
        )
    serving.run(
        serving.serve(
            *listeners, lifecycle=lifecycle, propagation_s=settings.readiness_propagation_s
        )
    )
