"""The activator's gRPC listener, the same standalone and in ``zeroserve up``.

The router's handlers on `foundation.grpc_front` (`activator.grpc.front`), under the
activator's `GrpcLimits` (message sizes, a bound on concurrent calls), as the data plane's;
or, with ``grpc_frontend`` ``aio``, a ``grpc.aio`` server (also Triton's keepalive
settings, no SO_REUSEPORT) with the same handlers. Either writes the same access log and
serves TLS (and mutual TLS) with the activator's ``grpc_use_ssl*`` settings. The channels
to workers carry the same message bounds the other way, in plaintext, and reconnect within
a second once a worker is back, rather than after gRPC's default backoff of up to two
minutes.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from types import TracebackType
from typing import Self

import grpc

from activator.access_log import AccessLogInterceptor
from activator.core import ActivatorCore
from activator.grpc.channels import WorkerChannels
from activator.grpc.front import front_rpcs
from activator.grpc.router import GrpcRouter
from activator.settings import ActivatorSettings
from foundation.grpc_front.app import GrpcApp
from foundation.grpc_front.server import serve_grpc_front
from foundation.grpc_limits import channel_options
from foundation.grpc_tls import load_server_tls, server_credentials
from foundation.serving import bind_socket, graceful

__all__ = ["GrpcListener", "worker_channel_options"]

logger = logging.getLogger(__name__)

_MAX_RECONNECT_BACKOFF_MS = 1000


def worker_channel_options(settings: ActivatorSettings) -> list[tuple[str, int]]:
    """gRPC core's arguments for the channels to workers."""
    return [
        ("grpc.max_send_message_length", settings.grpc_max_receive_bytes),
        ("grpc.max_receive_message_length", settings.grpc_max_send_bytes),
        # The connect timeout of each attempt, and the longest pause between attempts.
        ("grpc.min_reconnect_backoff_ms", int(settings.upstream_connect_timeout_s * 1000)),
        ("grpc.max_reconnect_backoff_ms", _MAX_RECONNECT_BACKOFF_MS),
    ]


class GrpcListener:
    """The activator's gRPC server over ``core``, as a listener (see `foundation.serving`).

    The port is bound on construction, so that a port in use fails before anything else
    starts (OSError), and the TLS files the settings name are read and checked then
    (ServerStartError when they cannot be served); construct it on the event loop it will
    serve on. Entering opens the core (shared with the HTTP app), starts the worker
    channels and the server; leaving stops accepting, gives calls in flight
    ``exit_timeout_s``, then closes the channels and releases the core. Call
    :meth:`aclose` if it is never entered.
    """

    def __init__(self, core: ActivatorCore, settings: ActivatorSettings, *, port: int) -> None:
        self._core = core
        self._settings = settings
        host = settings.host
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._server: grpc.aio.Server | None = None
        self._socket: socket.socket | None = None
        self._tls = load_server_tls(settings)
        if settings.grpc_frontend == "h2corn":
            self._socket = bind_socket(host, port)
            bound = self._socket.getsockname()[1]
        else:
            access_log = core.access_log
            self._server = grpc.aio.server(
                options=channel_options(settings),
                maximum_concurrent_rpcs=settings.grpc_max_concurrent_rpcs,
                interceptors=[] if access_log is None else [AccessLogInterceptor(access_log)],
            )
            try:
                if self._tls is None:
                    bound = self._server.add_insecure_port(address)
                else:
                    bound = self._server.add_secure_port(address, server_credentials(self._tls))
            except RuntimeError as exc:  # gRPC's answer to a port in use
                raise OSError(f"cannot bind the gRPC server to {address}: {exc}") from None
        self.address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        """``host:port`` the server listens on."""
        self.port = bound
        self._stack: contextlib.AsyncExitStack | None = None
        self._channels: WorkerChannels | None = None

    @property
    def open_channels(self) -> int:
        """Channels open to workers now."""
        return 0 if self._channels is None else len(self._channels)

    async def __aenter__(self) -> Self:
        async with contextlib.AsyncExitStack() as stack:
            parts = await stack.enter_async_context(self._core.open())
            channels = WorkerChannels(parts.table, worker_channel_options(self._settings))
            self._channels = channels
            stack.push_async_callback(channels.close)
            parts.replica_events.subscribe(channels)
            stack.callback(parts.replica_events.unsubscribe, channels)
            router = GrpcRouter(parts, channels)
            if self._socket is not None:
                app = GrpcApp(
                    front_rpcs(router.methods(), self._core.access_log),
                    max_receive_bytes=self._settings.grpc_max_receive_bytes,
                    max_send_bytes=self._settings.grpc_max_send_bytes,
                    max_concurrent_rpcs=self._settings.grpc_max_concurrent_rpcs,
                )
                await stack.enter_async_context(
                    serve_grpc_front(
                        app,
                        self._socket,
                        self._settings,
                        drain_timeout_s=self._settings.exit_timeout_s,
                        tls=self._tls,
                    )
                )
            else:
                assert self._server is not None
                self._server.add_generic_rpc_handlers([router.handler()])
                await stack.enter_async_context(
                    graceful(self._server, grace_s=self._settings.exit_timeout_s)
                )
            logger.info(
                "activator gRPC server listening on %s%s",
                self.address,
                "" if self._tls is None else f" ({self._tls.mode})",
            )
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def aclose(self) -> None:
        """Free the port of a listener that was never entered (harmless otherwise)."""
        if self._server is not None:
            await self._server.stop(None)
        if self._socket is not None:
            self._socket.close()
