"""``zeroserve up``: control plane, activator and local workers in one process.

The composition root of the embedded platform (and, without the activator, of a standalone
control plane). It builds the store, backend, placer, orchestrator, reaper, autoscaler loop,
lease and the two HTTP apps, and runs the admin and public servers (the activator's HTTP
and, with ``grpc_port``, gRPC endpoints over one activator core) on one event loop
(`foundation.serving`). Each part goes on an ``AsyncExitStack`` as it starts, so the stop is
the start in reverse, and a failure half-way stops exactly what had started. The order loses
no request:

1. stop the public servers (gRPC, then HTTP): each refuses new connections and lets
   in-flight requests finish (bounded), then the activator's core answers buffered
   requests with 503 (UNAVAILABLE);
2. stop the control loops and activations, then the admin server;
3. stop the workers (SIGTERM, then SIGKILL after ``worker_stop_timeout_s``);
4. release the lease, close the store.

Workers die with the platform however it ends: the stop above, a second Ctrl-C (workers are
killed at once), or a SIGKILL of this process (``PR_SET_PDEATHSIG``, see ``backends.local``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from activator.remote_activation import StoreActivate
from activator.settings import ActivatorSettings
from control_plane.activation import Orchestrator
from control_plane.api import schemas
from control_plane.api.app import create_app as create_admin_app
from control_plane.api.service import AdminService, FollowLimits
from control_plane.autoscaler.loop import AutoscalerLoop
from control_plane.autoscaler.policy import AutoscalerSettings
from control_plane.backends.base import PodBackend
from control_plane.backends.local import LocalBackend
from control_plane.errors import ModelExistsError
from control_plane.inspection.inspector import RegistrationInspector
from control_plane.lease import Lease
from control_plane.metrics import ControlPlaneMetrics
from control_plane.placement import PoolPlacers
from control_plane.reaper import Reaper
from control_plane.settings import ControlPlaneSettings
from control_plane.store.base import StateStore
from control_plane.store.errors import StoreUnavailableError
from control_plane.store.factory import open_quota_counters, open_state_store
from control_plane.store.sqlite import SqliteStateStore
from control_plane.worker_client import WorkerClient
from control_plane.worker_metrics import WorkerMetrics
from foundation import serving
from foundation.cloudwatch import CloudWatchPublisher, PutMetricDataSink
from foundation.serving import (
    HttpListener,
    Lifecycle,
    ServerStartError,
    StopSignals,
    bind_socket,
)
from runtimes.registry import available_backends

if TYPE_CHECKING:
    from control_plane.backends.knative.settings import KnativeSettings

__all__ = ["Platform", "default_repository", "ensure_admin_token", "serve"]

logger = logging.getLogger(__name__)

_SERVER_START_TIMEOUT_S = 60.0
_SERVER_STOP_MARGIN_S = 10.0
"""How long past its drain deadline a server may take to stop (its lifespan's shutdown)
before it is cancelled."""
_ADMIN_DRAIN_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class _PublicEndpoints:
    url: str
    """The activator's HTTP endpoint."""
    grpc_address: str | None
    """Its gRPC endpoint (``host:port``), when it serves one."""


class _WorkerLostRelay:
    """The backend's ``WorkerLost`` callback, pointed at the placer once it exists."""

    def __init__(self) -> None:
        self.target: Callable[[str], Coroutine[Any, Any, None]] | None = None

    async def __call__(self, worker_id: str) -> None:
        if self.target is not None:
            await self.target(worker_id)


class _EmbeddedActivate:
    """The in-process activator's ``Activate``: the orchestrator itself while this replica
    acts, else a request through the store for the replica that does."""

    def __init__(
        self, orchestrator: Orchestrator, lease: Lease, remote: Callable[[str], Awaitable[None]]
    ) -> None:
        self._orchestrator = orchestrator
        self._lease = lease
        self._remote = remote

    async def __call__(self, model: str) -> None:
        if self._lease.is_acting:
            await self._orchestrator.activate(model, trigger="request")
        else:
            await self._remote(model)


def ensure_admin_token(settings: ControlPlaneSettings) -> tuple[ControlPlaneSettings, bool]:
    """``settings`` with an admin token, generating one when unset; (settings, generated)."""
    if settings.admin_token is not None:
        return settings, False
    token = SecretStr(secrets.token_urlsafe(24))
    return settings.model_copy(update={"admin_token": token}), True


class Platform:
    """One control-plane replica, optionally with an activator, on the running loop.

    Parameters:
        settings: the control plane's settings (with an admin token).
        activator_settings: the in-process activator's; None for a standalone control plane.
        demo: write the demo model into the cache folder and register it (min_replicas 0).
        out: where the start banner goes.
        knative: the knative backend's settings when ``settings.backend`` is ``knative``;
            None reads them from the environment.
        on_started: called with the admin API's URL once every server listens, before the
            banner (``zeroserve up`` stores the URL and token for the command line there).
    """

    def __init__(
        self,
        settings: ControlPlaneSettings,
        activator_settings: ActivatorSettings | None = None,
        *,
        demo: bool = False,
        out: TextIO = sys.stdout,
        knative: KnativeSettings | None = None,
        on_started: Callable[[str], None] | None = None,
    ) -> None:
        if settings.admin_token is None:
            raise ValueError("the platform needs an admin token (see ensure_admin_token)")
        self._demo_dir = settings.cache_dir / "demo"
        if demo:
            allowed = (*settings.allowed_storage, str(self._demo_dir))
            settings = settings.model_copy(update={"allowed_storage": allowed})
        self.settings = settings
        self._activator_settings = activator_settings
        self._demo = demo
        self._out = out
        self._knative = knative
        self._on_started = on_started
        self._backend: PodBackend | None = None
        self._activator_registry: CollectorRegistry | None = None
        """The in-process activator's metrics, which the console reads for request rates;
        new in each ``run``."""
        self._demo_key: str | None = None
        self.lifecycle = Lifecycle()
        """The public server's: readiness fails once the platform is stopping."""

    def kill_workers_now(self) -> None:
        """SIGKILL every local worker at once (a second Ctrl-C); pods are the cluster's."""
        if isinstance(self._backend, LocalBackend):
            self._backend.kill_now()

    async def run(self, stop: asyncio.Event) -> None:
        """Start everything, serve until ``stop`` is set, then stop what started, in reverse
        (a failure half-way stops exactly what had started)."""
        settings = self.settings
        assert settings.admin_token is not None
        self._activator_registry = CollectorRegistry() if self._activator_settings else None
        async with contextlib.AsyncExitStack() as stack:
            # Bound first: a port in use fails before anything starts.
            admin_sock = stack.enter_context(bind_socket(settings.admin_host, settings.admin_port))
            public_sock = None
            if self._activator_settings is not None:
                public_sock = stack.enter_context(
                    bind_socket(self._activator_settings.host, self._activator_settings.port)
                )
                if self._activator_settings.grpc_port:
                    # gRPC binds only once its server is built, on the loop, late: this
                    # makes a port in use fail now, before anything starts.
                    host = self._activator_settings.host
                    bind_socket(host, self._activator_settings.grpc_port).close()
            store = open_state_store(settings.state_url)
            stack.push_async_callback(store.close)
            if isinstance(store, SqliteStateStore):
                # The file is one platform's: a second one on it stops here, before it
                # starts a worker of its own.
                try:
                    await store.open()
                except StoreUnavailableError as exc:
                    raise ServerStartError(server="platform", reason=exc.message) from exc
            registry = CollectorRegistry()
            metrics = ControlPlaneMetrics(registry)
            workers = WorkerClient(
                load_timeout_s=settings.load_timeout_s,
                unload_timeout_s=settings.unload_timeout_s,
                allow_model_code=settings.allow_model_code,
            )
            stack.push_async_callback(workers.close)
            holder = f"control-plane-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
            lease = Lease(
                store,
                holder,
                ttl_s=settings.lease_ttl_s,
                renew_s=settings.lease_renew_s,
                metrics=metrics,
            )
            # Released only once the workers have stopped (the backend closes before it), so
            # that no other replica acts while this one still stops them. Releasing a lease
            # not held does nothing.
            stack.push_async_callback(lease.release)
            relay = _WorkerLostRelay()
            repository = settings.worker_repository or default_repository(settings.cache_dir)
            extra_env = {}
            if settings.allowed_storage:
                extra_env["ZEROSERVE_ALLOWED_STORAGE"] = ",".join(settings.allowed_storage)
            backend = self._backend = self._create_backend(relay, repository, extra_env)
            stack.push_async_callback(backend.close)
            placer = PoolPlacers(store, backend, workers, settings)
            await placer.ensure_pools()
            stack.push_async_callback(placer.close)
            await lease.renew()
            stack.push_async_callback(_cancel, [asyncio.create_task(lease.run(), name="lease")])

            publisher = None
            if settings.cloudwatch_enabled:
                publisher = CloudWatchPublisher(
                    PutMetricDataSink(),
                    flush_interval_s=settings.cloudwatch_flush_interval_s,
                    max_values=settings.cloudwatch_max_values,
                )
            orchestrator = Orchestrator(
                store, placer, settings, metrics, lease, probe=workers.is_live, observer=publisher
            )

            async def worker_lost(worker_id: str) -> None:
                metrics.worker_stops.labels("lost").inc()
                await placer.forget_worker(worker_id)

            relay.target = worker_lost
            reaper = Reaper(store, placer, backend, orchestrator, workers, settings, metrics, lease)
            inspector = self._create_inspector(placer)
            if inspector is not None:
                stack.callback(inspector.close)
            service = AdminService(
                store,
                orchestrator,
                placer,
                backend,
                lease,
                inspector=inspector,
                versions=workers,
                follow=FollowLimits(poll_s=settings.follow_poll_s, max_s=settings.follow_max_s),
            )
            worker_metrics = None
            if isinstance(backend, LocalBackend):
                # Local workers listen on ports chosen at run time, which no scrape
                # configuration can name: the admin port serves their families. Pods are
                # scraped by Prometheus itself (deploy/kubernetes' PodMonitor).
                worker_metrics = WorkerMetrics(backend, timeout_s=settings.worker_metrics_timeout_s)
                stack.push_async_callback(worker_metrics.close)
            admin = HttpListener(
                create_admin_app(
                    service,
                    token=settings.admin_token.get_secret_value(),
                    registry=registry,
                    acting=lease,
                    allowed_storage=settings.allowed_storage,
                    allow_model_code=settings.allow_model_code,
                    worker_metrics=worker_metrics,
                    request_metrics=self._activator_registry,
                    console_session_s=settings.console_session_s,
                ),
                settings,
                admin_sock,
                name="admin API",
                drain_timeout_s=_ADMIN_DRAIN_TIMEOUT_S,
                start_timeout_s=_SERVER_START_TIMEOUT_S,
                stop_timeout_s=_ADMIN_DRAIN_TIMEOUT_S + _SERVER_STOP_MARGIN_S,
            )
            await stack.enter_async_context(admin)

            # The control loops: stopped after the public server (its buffered requests may
            # still need activations), the orchestrator before the publisher (its last
            # activations count).
            stack.push_async_callback(reaper.close)
            if publisher is not None:
                stack.push_async_callback(publisher.close)
            stack.push_async_callback(orchestrator.close)
            autoscaler = AutoscalerLoop(
                store,
                orchestrator,
                placer,
                AutoscalerSettings(
                    stable_window_s=settings.stable_window_s,
                    panic_window_s=settings.panic_window_s,
                    panic_threshold=settings.panic_threshold,
                    scale_down_delay_s=settings.scale_down_delay_s,
                ),
                metrics,
                lease,
                tick_s=settings.autoscaler_tick_s,
                retry_s=settings.store_retry_s,
            )
            loops = [
                asyncio.create_task(orchestrator.run(), name="activation-requests"),
                asyncio.create_task(reaper.run(), name="reaper"),
                asyncio.create_task(autoscaler.run(), name="autoscaler"),
            ]
            if publisher is not None:
                loops.append(asyncio.create_task(publisher.run(), name="cloudwatch"))
            stack.push_async_callback(_cancel, loops)

            public: _PublicEndpoints | None = None
            if self._activator_settings is not None and public_sock is not None:
                # Started last, stopped first: they stop accepting, let in-flight requests
                # finish (bounded) and the core answers buffered requests with 503.
                public = await stack.enter_async_context(
                    self._public_servers(
                        self._activator_settings,
                        public_sock,
                        _EmbeddedActivate(
                            orchestrator,
                            lease,
                            StoreActivate.from_settings(store, self._activator_settings),
                        ),
                        store,
                    )
                )
            if self._demo:
                await self._register_demo(service)
            if self._on_started is not None:
                self._on_started(admin.url)
            self._banner(admin.url, public)
            await stop.wait()
            logger.info("stopping")
        logger.info("stopped")

    @contextlib.asynccontextmanager
    async def _public_servers(
        self,
        settings: ActivatorSettings,
        sock: socket.socket,
        activate: _EmbeddedActivate,
        store: StateStore,
    ) -> AsyncIterator[_PublicEndpoints]:
        """The activator's HTTP server and, with ``grpc_port``, its gRPC server, over one
        core: opened first and released last, so that both drain before buffered requests
        are failed."""
        from activator.app import create_app_on
        from activator.core import ActivatorCore
        from activator.grpc.server import GrpcListener
        from activator.server import create_server

        counters = open_quota_counters(settings.state_url, timeout_s=settings.quota_store_timeout_s)
        core = ActivatorCore(
            settings,
            store,
            activate,
            f"activator-{socket.gethostname()}-{os.getpid()}",
            lifecycle=self.lifecycle,
            registry=self._activator_registry,
            counters=counters,
        )
        async with contextlib.AsyncExitStack() as stack:
            if counters is not None:
                stack.push_async_callback(counters.close)
            await stack.enter_async_context(core.open())
            http = create_server(
                create_app_on(core),
                settings,
                sock,
                start_timeout_s=_SERVER_START_TIMEOUT_S,
                stop_timeout_s=settings.exit_timeout_s + _SERVER_STOP_MARGIN_S,
            )
            await stack.enter_async_context(http)
            grpc_address = None
            if settings.grpc_port:
                listener = GrpcListener(core, settings, port=settings.grpc_port)
                stack.push_async_callback(listener.aclose)
                await stack.enter_async_context(listener)
                grpc_address = listener.address
            yield _PublicEndpoints(url=http.url, grpc_address=grpc_address)

    def _create_backend(
        self, relay: _WorkerLostRelay, repository: Path, extra_env: dict[str, str]
    ) -> PodBackend:
        if self.settings.backend == "knative":
            # Imported here: the embedded platform must not need the kubernetes client.
            from control_plane.backends.knative.backend import create_knative_backend
            from control_plane.backends.knative.settings import KnativeSettings

            knative = self._knative or KnativeSettings()
            return create_knative_backend(self.settings, knative, on_worker_lost=relay)
        return LocalBackend(
            self.settings, on_worker_lost=relay, repository=repository, extra_env=extra_env
        )

    def _create_inspector(self, placer: PoolPlacers) -> RegistrationInspector | None:
        settings = self.settings
        if not settings.inspect_registrations:
            return None
        # Local workers run this interpreter's packages; pods' images are not known here.
        backends = available_backends() if settings.backend == "local" else None
        return RegistrationInspector(
            allowed_storage=settings.allowed_storage,
            allow_model_code=settings.allow_model_code,
            pool_of=lambda record: (placer.pool_of(record), backends),
            timeout_s=settings.inspect_timeout_s,
        )

    async def _register_demo(self, service: AdminService) -> None:
        from data_plane.demo import DEMO_MODEL, write_demo_repository

        model_dir = await asyncio.to_thread(write_demo_repository, self._demo_dir)
        body = schemas.ModelCreate.model_validate(
            {"name": DEMO_MODEL, "storage_uri": str(model_dir), "scaling": {"min_replicas": 0}},
            context={"allowed_storage": self.settings.allowed_storage},
        )
        with contextlib.suppress(ModelExistsError):
            await service.register(body)
        activator = self._activator_settings
        if activator is not None and activator.auth == "keys":
            from control_plane.keys import KeyService

            # A key for the demo model only: what the banner's curl line sends.
            self._demo_key, _ = await KeyService(service.store).create("demo", models=(DEMO_MODEL,))

    def _banner(self, admin: str, endpoints: _PublicEndpoints | None) -> None:
        lines = [
            f"zeroserve: admin API {admin}/admin/v1 (state {self.settings.state_url})",
            f"zeroserve: web console {admin}/console (log in with the admin token)",
        ]
        if endpoints is not None:
            public = endpoints.url
            lines.insert(0, f"zeroserve: serving models at {public}/v2/models/<name>/infer")
            if endpoints.grpc_address is not None:
                lines.insert(1, f"zeroserve: serving models over gRPC at {endpoints.grpc_address}")
            if self._demo:
                from data_plane.demo import DEMO_MODEL

                auth = ""
                if self._demo_key is not None:
                    # The demo key (for the demo model only) is shown here, once.
                    auth = f' -H "Authorization: Bearer {self._demo_key}"'
                lines.append(
                    f"demo model '{DEMO_MODEL}' registered (scaled to zero); try:\n"
                    f"  curl -s -X POST {public}/v2/models/{DEMO_MODEL}/infer{auth}"
                    ' -d \'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],'
                    '"data":[1,2,3,4]}]}\''
                )
        print("\n".join(lines), file=self._out, flush=True)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def serve(
    settings: ControlPlaneSettings,
    activator_settings: ActivatorSettings | None,
    *,
    demo: bool = False,
    out: TextIO = sys.stdout,
    knative: KnativeSettings | None = None,
    on_started: Callable[[str], None] | None = None,
) -> int:
    """Run the platform until SIGINT or SIGTERM; a second signal kills the workers at once.
    ``on_started`` is called with the admin API's URL once it listens."""
    platform = Platform(
        settings, activator_settings, demo=demo, out=out, knative=knative, on_started=on_started
    )
    # One line per proxied request and per probe would drown the log (and cost time).
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))

    def kill_now(sig: int) -> None:
        print("zeroserve: second signal, killing workers", file=sys.stderr, flush=True)
        platform.kill_workers_now()
        os._exit(130)

    async def main() -> None:
        # Readiness is the public server's: it fails at the first signal, and the activator's
        # propagation pause (0 by default, and without an activator) runs before the stop.
        propagation_s = 0.0
        if activator_settings is not None:
            propagation_s = activator_settings.readiness_propagation_s
        with StopSignals(
            platform.lifecycle, propagation_s=propagation_s, on_repeat=kill_now
        ) as signals:
            await platform.run(signals.stop)

    serving.run(main())
    return 0


def default_repository(cache_dir: Path) -> Path:
    """The empty model repository local workers start with."""
    return cache_dir / "workers" / "repository"
