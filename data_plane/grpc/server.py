"""The gRPC listener: the inference service under the limits and keepalive options of
`foundation.grpc_limits.GrpcLimits`, carried by the front end its ``grpc_frontend`` names
(a grpc.aio server, or `foundation.grpc_front` over h2corn), as the listener
`foundation.serving` starts and drains beside the HTTP one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from data_plane.grpc.servicer import InferenceServicer, front_rpcs, service_handler
from data_plane.handlers import Handlers
from foundation.grpc_front.app import GrpcApp
from foundation.grpc_front.server import serve_grpc_front
from foundation.grpc_limits import GrpcLimits, channel_options
from foundation.grpc_tls import ServerTls, load_server_tls, server_credentials
from foundation.serving import ServerStartError, bind_socket

logger = logging.getLogger(__name__)


def create_grpc_app(handlers: Handlers, limits: GrpcLimits) -> GrpcApp:
    """The inference service with ``handlers`` as an app for `foundation.grpc_front`."""
    servicer = InferenceServicer(handlers, stream_max_in_flight=limits.grpc_stream_max_in_flight)
    return GrpcApp(
        front_rpcs(servicer),
        max_receive_bytes=limits.grpc_max_receive_bytes,
        max_send_bytes=limits.grpc_max_send_bytes,
        max_concurrent_rpcs=limits.grpc_max_concurrent_rpcs,
    )


def create_grpc_server(handlers: Handlers, limits: GrpcLimits) -> grpc.aio.Server:
    """A server (not started, no port yet) serving ``inference.GRPCInferenceService`` with
    ``handlers``. Call it with the event loop it will serve on running."""
    servicer = InferenceServicer(handlers, stream_max_in_flight=limits.grpc_stream_max_in_flight)
    return grpc.aio.server(
        handlers=[service_handler(servicer)],
        options=channel_options(limits),
        maximum_concurrent_rpcs=limits.grpc_max_concurrent_rpcs,
    )


async def start_grpc_server(
    server: grpc.aio.Server, host: str, port: int, tls: ServerTls | None = None
) -> int:
    """Bind ``host:port`` (0: a free port), over ``tls`` when given, and start serving;
    returns the bound port. Raises RuntimeError when the address cannot be bound."""
    address = f"{host}:{port}"
    if tls is None:
        bound = server.add_insecure_port(address)
    else:
        bound = server.add_secure_port(address, server_credentials(tls))
    if bound == 0:
        # Older grpcio versions return 0 instead of raising.
        raise RuntimeError(f"cannot bind the gRPC server to {host}:{port}")
    await server.start()
    logger.info("gRPC server listening on %s:%d%s", host, bound, _tls_note(tls))
    return bound


def _tls_note(tls: ServerTls | None) -> str:
    return "" if tls is None else f" ({tls.mode})"


def check_port(host: str, port: int) -> None:
    """Raise OSError now if ``host:port`` cannot be bound, so that a port in use fails
    before any server starts (gRPC binds only once its server is built, on the loop)."""
    bind_socket(host, port).close()


@contextlib.asynccontextmanager
async def grpc_listener(
    handlers: Callable[[], Handlers],
    limits: GrpcLimits,
    *,
    host: str,
    port: int,
    drain_timeout_s: float,
) -> AsyncIterator[int]:
    """The gRPC server as a listener for `foundation.serving.serve`: on entry it is built
    over ``handlers()`` (called then, so that they may come from a listener started
    before), bound to ``host:port`` (0: a free port) and started, and the bound port is
    yielded; on exit it stops taking calls and gives those in flight up to
    ``drain_timeout_s`` before cancelling them. A port that cannot be bound, or TLS files
    that cannot be served (``grpc_use_ssl``), raise ServerStartError."""
    tls = await asyncio.to_thread(load_server_tls, limits)
    if limits.grpc_frontend == "h2corn":
        async with _front_listener(handlers(), limits, tls, host, port, drain_timeout_s) as bound:
            yield bound
        return
    server = create_grpc_server(handlers(), limits)
    try:
        bound = await start_grpc_server(server, host, port, tls)
    except RuntimeError as exc:
        raise ServerStartError(server="gRPC", reason=str(exc)) from None
    try:
        yield bound
    finally:
        await server.stop(drain_timeout_s)
        logger.info("gRPC server stopped")


@contextlib.asynccontextmanager
async def _front_listener(
    handlers: Handlers,
    limits: GrpcLimits,
    tls: ServerTls | None,
    host: str,
    port: int,
    drain_timeout_s: float,
) -> AsyncIterator[int]:
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        raise ServerStartError(server="gRPC", reason=str(exc)) from None
    with sock:
        app = create_grpc_app(handlers, limits)
        async with serve_grpc_front(
            app, sock, limits, drain_timeout_s=drain_timeout_s, tls=tls
        ) as bound:
            logger.info("gRPC server listening on %s:%d (h2corn)%s", host, bound, _tls_note(tls))
            yield bound
    logger.info("gRPC server stopped")
