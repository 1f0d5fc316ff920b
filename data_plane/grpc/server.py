"""The gRPC listener: a grpc.aio server carrying the inference service, under the limits
and keepalive options of :class:`~data_plane.grpc.settings.GrpcSettings`, and the listener
`foundation.serving` starts and drains beside the HTTP one."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Final

import grpc

from data_plane.grpc.servicer import InferenceServicer, service_handler
from data_plane.grpc.settings import GrpcSettings
from data_plane.handlers import Handlers
from foundation.serving import ServerStartError, bind_socket

logger = logging.getLogger(__name__)

_UNSET: Final = 0


def channel_options(settings: GrpcSettings) -> list[tuple[str, int]]:
    """gRPC core's channel arguments for ``settings`` (the names Triton sets for its
    flags)."""
    options = [
        ("grpc.max_receive_message_length", settings.grpc_max_receive_bytes),
        ("grpc.max_send_message_length", settings.grpc_max_send_bytes),
        ("grpc.keepalive_time_ms", settings.grpc_keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.grpc_keepalive_timeout_ms),
        (
            "grpc.keepalive_permit_without_calls",
            int(settings.grpc_keepalive_permit_without_calls),
        ),
        ("grpc.http2.max_pings_without_data", settings.grpc_http2_max_pings_without_data),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            settings.grpc_http2_min_recv_ping_interval_without_data_ms,
        ),
        ("grpc.http2.max_ping_strikes", settings.grpc_http2_max_ping_strikes),
        # gRPC sets SO_REUSEPORT by default, which would let a second server bind a port in
        # use and share its connections; a port must belong to one server, as in Triton.
        ("grpc.so_reuseport", 0),
    ]
    if settings.grpc_max_connection_age_ms != _UNSET:
        options.append(("grpc.max_connection_age_ms", settings.grpc_max_connection_age_ms))
    if settings.grpc_max_connection_age_grace_ms != _UNSET:
        options.append(
            ("grpc.max_connection_age_grace_ms", settings.grpc_max_connection_age_grace_ms)
        )
    return options


def create_grpc_server(handlers: Handlers, settings: GrpcSettings) -> grpc.aio.Server:
    """A server (not started, no port yet) serving ``inference.GRPCInferenceService`` with
    ``handlers``. Call it with the event loop it will serve on running."""
    servicer = InferenceServicer(handlers, stream_max_in_flight=settings.grpc_stream_max_in_flight)
    return grpc.aio.server(
        handlers=[service_handler(servicer)],
        options=channel_options(settings),
        maximum_concurrent_rpcs=settings.grpc_max_concurrent_rpcs,
    )


async def start_grpc_server(server: grpc.aio.Server, host: str, port: int) -> int:
    """Bind ``host:port`` (0: a free port) and start serving; returns the bound port.
    Raises RuntimeError when the address cannot be bound."""
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        # Older grpcio versions return 0 instead of raising.
        raise RuntimeError(f"cannot bind the gRPC server to {host}:{port}")
    await server.start()
    logger.info("gRPC server listening on %s:%d", host, bound)
    return bound


def check_port(host: str, port: int) -> None:
    """Raise OSError now if ``host:port`` cannot be bound, so that a port in use fails
    before any server starts (gRPC binds only once its server is built, on the loop)."""
    bind_socket(host, port).close()


@contextlib.asynccontextmanager
async def grpc_listener(
    handlers: Callable[[], Handlers],
    settings: GrpcSettings,
    *,
    host: str,
    drain_timeout_s: float,
) -> AsyncIterator[int]:
    """The gRPC server as a listener for `foundation.serving.serve`: on entry it is built
    over ``handlers()`` (called then, so that they may come from a listener started
    before), bound to ``host`` and ``settings.grpc_port`` and started, and the bound port
    is yielded; on exit it stops taking calls and gives those in flight up to
    ``drain_timeout_s`` before cancelling them. A port that cannot be bound raises
    ServerStartError."""
    server = create_grpc_server(handlers(), settings)
    try:
        port = await start_grpc_server(server, host, settings.grpc_port)
    except RuntimeError as exc:
        raise ServerStartError(server="gRPC", reason=str(exc)) from None
    try:
        yield port
    finally:
        await server.stop(drain_timeout_s)
        logger.info("gRPC server stopped")
