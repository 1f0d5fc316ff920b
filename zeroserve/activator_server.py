"""``zeroserve activator``: a standalone activator (cluster mode), composed here: its HTTP
endpoint and, with ``grpc_port``, its gRPC endpoint, over one activator core.

A standalone activator reaches the control plane only through the shared state store: it
follows placements, asks for activations with ``store.request_activation`` (the acting
control plane consumes them with ``subscribe_activation_requests``; ``StoreActivate``
watches the model's record meanwhile, to answer a load failing for good at once) and reports
traffic and first responses there. The store is the control plane's, so the two are joined here, at
the top, and the activator package never imports the control plane.
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractAsyncContextManager

from activator.app import create_app_on
from activator.core import ActivatorCore
from activator.grpc.server import GrpcListener
from activator.remote_activation import StoreActivate
from activator.server import create_server
from activator.settings import ActivatorSettings
from activator.state import Lifecycle
from foundation import serving
from foundation.serving import bind_socket


def serve(settings: ActivatorSettings, activator_id: str) -> int:
    """Serve until SIGINT or SIGTERM (draining first); the exit status."""
    # One line per proxied request would drown the log (and cost time), as in ``up``.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    serving.run(_serve(settings, activator_id))
    return 0


async def _serve(settings: ActivatorSettings, activator_id: str) -> None:
    # Imported here: a cluster store pulls in its client library only when it is used.
    from control_plane.store.factory import open_quota_counters, open_state_store

    async with contextlib.AsyncExitStack() as stack:
        try:
            store = open_state_store(settings.state_url)
        except ValueError as exc:
            raise SystemExit(f"activator: {exc}") from None
        stack.push_async_callback(store.close)
        counters = open_quota_counters(settings.state_url, timeout_s=settings.quota_store_timeout_s)
        if counters is not None:
            stack.push_async_callback(counters.close)
        lifecycle = Lifecycle()
        # One core for both endpoints: each listener opens it, and the last to stop (HTTP,
        # started first) fails what still waits in the buffer.
        activate = StoreActivate.from_settings(store, settings)
        core = ActivatorCore(
            settings,
            store,
            activate,
            activator_id,
            lifecycle=lifecycle,
            counters=counters,
        )
        listeners: list[AbstractAsyncContextManager[object]] = [
            create_server(create_app_on(core), settings, bind_socket(settings.host, settings.port))
        ]
        if settings.grpc_port:
            grpc_listener = GrpcListener(core, settings, port=settings.grpc_port)
            stack.push_async_callback(grpc_listener.aclose)
            listeners.append(grpc_listener)
        await serving.serve(
            *listeners, lifecycle=lifecycle, propagation_s=settings.readiness_propagation_s
        )
