"""``zeroserve up``: control plane, activator and local workers in one process.

The composition root of the embedded platform (and, without the activator, of a standalone
control plane). It builds the store, backend, placer, orchestrator, reaper, autoscaler loop,
lease and the two HTTP apps, runs the admin and public servers on one event loop, and stops
everything in an order that loses no request:

1. stop the public server: it refuses new connections, lets in-flight requests finish
   (bounded) and its lifespan answers buffered requests with 503;
2. stop the control loops and activations;
3. stop the workers (SIGTERM, then SIGKILL after ``worker_stop_timeout_s``);
4. release the lease, stop the admin server, close the store.

Workers die with the platform however it ends: the stop above, a second Ctrl-C (workers are
killed at once), or a SIGKILL of this process (``PR_SET_PDEATHSIG``, see ``backends.local``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Callable, Coroutine, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import uvicorn
from prometheus_client import CollectorRegistry
from pydantic import SecretStr
from starlette.types import ASGIApp

from activator.settings import ActivatorSettings
from control_plane.activation import Orchestrator
from control_plane.api import schemas
from control_plane.api.app import create_app as create_admin_app
from control_plane.api.service import AdminService
from control_plane.autoscaler.loop import AutoscalerLoop
from control_plane.autoscaler.policy import AutoscalerSettings
from control_plane.backends.base import PodBackend, PoolSpec
from control_plane.backends.local import LocalBackend
from control_plane.errors import ModelExistsError
from control_plane.lease import Lease
from control_plane.metrics import ControlPlaneMetrics
from control_plane.placement import Placer
from control_plane.reaper import Reaper
from control_plane.settings import ControlPlaneSettings
from control_plane.store.base import StateStore
from control_plane.store.factory import open_state_store
from control_plane.worker_client import WorkerClient
from foundation.cloudwatch import CloudWatchPublisher, PutMetricDataSink
from foundation.http import ServerLimits, http_config

if TYPE_CHECKING:
    from control_plane.backends.knative.settings import KnativeSettings

__all__ = ["Platform", "bind_socket", "default_repository", "ensure_admin_token", "serve"]

logger = logging.getLogger(__name__)

_SERVER_START_TIMEOUT_S = 60.0
_ADMIN_STOP_TIMEOUT_S = 10.0


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to the platform (two servers share one loop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


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

    def __init__(self, orchestrator: Orchestrator, lease: Lease, store: StateStore) -> None:
        self._orchestrator = orchestrator
        self._lease = lease
        self._store = store

    async def __call__(self, model: str) -> None:
        if self._lease.is_acting:
            await self._orchestrator.activate(model, trigger="request")
        else:
            await self._store.request_activation(model)


def ensure_admin_token(settings: ControlPlaneSettings) -> tuple[ControlPlaneSettings, bool]:
    """``settings`` with an admin token, generating one when unset; (settings, generated)."""
    if settings.admin_token is not None:
        return settings, False
    token = SecretStr(secrets.token_urlsafe(24))
    return settings.model_copy(update={"admin_token": token}), True


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on ``host:port`` (0 picks a port), not inheritable."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


class Platform:
    """One control-plane replica, optionally with an activator, on the running loop.

    Parameters:
        settings: the control plane's settings (with an admin token).
        activator_settings: the in-process activator's; None for a standalone control plane.
        demo: write the demo model into the cache folder and register it (min_replicas 0).
        out: where the start banner goes.
        knative: the knative backend's settings when ``settings.backend`` is ``knative``;
            None reads them from the environment.
    """

    def __init__(
        self,
        settings: ControlPlaneSettings,
        activator_settings: ActivatorSettings | None = None,
        *,
        demo: bool = False,
        out: TextIO = sys.stdout,
        knative: KnativeSettings | None = None,
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
        self._backend: PodBackend | None = None

    def kill_workers_now(self) -> None:
        """SIGKILL every local worker at once (a second Ctrl-C); pods are the cluster's."""
        if isinstance(self._backend, LocalBackend):
            self._backend.kill_now()

    async def run(self, stop: asyncio.Event) -> None:
        """Start everything, serve until ``stop`` is set, then stop everything."""
        settings = self.settings
        assert settings.admin_token is not None
        admin_sock = bind_socket(settings.admin_host, settings.admin_port)
        public_sock = None
        if self._activator_settings is not None:
            public_sock = bind_socket(self._activator_settings.host, self._activator_settings.port)
        store = open_state_store(settings.state_url)
        registry = CollectorRegistry()
        metrics = ControlPlaneMetrics(registry)
        relay = _WorkerLostRelay()
        repository = settings.worker_repository or default_repository(settings.cache_dir)
        extra_env = {}
        if settings.allowed_storage:
            extra_env["ZEROSERVE_ALLOWED_STORAGE"] = ",".join(settings.allowed_storage)
        backend = self._backend = self._create_backend(relay, repository, extra_env)
        workers = WorkerClient(
            load_timeout_s=settings.load_timeout_s,
            unload_timeout_s=settings.unload_timeout_s,
            allow_model_code=settings.allow_model_code,
        )
        holder = f"control-plane-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        lease = Lease(
            store,
            holder,
            ttl_s=settings.lease_ttl_s,
            renew_s=settings.lease_renew_s,
            metrics=metrics,
        )
        pool = PoolSpec(
            name=settings.pool,
            device=settings.worker_device,
            memory_bytes=settings.worker_memory_bytes,
            max_workers=settings.max_workers,
        )
        placer = Placer(store, backend, pool, workers, settings)
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
        service = AdminService(store, orchestrator, placer, backend, lease)
        admin_app = create_admin_app(
            service,
            token=settings.admin_token.get_secret_value(),
            registry=registry,
            acting=lease,
            allowed_storage=settings.allowed_storage,
            allow_model_code=settings.allow_model_code,
        )
        loops: list[asyncio.Task[None]] = []
        admin_server = public_server = None
        admin_task = public_task = None
        try:
            await backend.ensure_pool(pool)
            await lease.renew()
            loops.append(asyncio.create_task(lease.run(), name="lease"))
            admin_server = _server(admin_app, settings.admin_host, settings, timeout_s=5)
            admin_task = await _start(admin_server, admin_sock, "admin API")
            if self._activator_settings is not None and public_sock is not None:
                from activator.app import create_app as create_activator_app
                from activator.state import Lifecycle

                lifecycle = Lifecycle()
                activator_app = create_activator_app(
                    self._activator_settings,
                    store,
                    _EmbeddedActivate(orchestrator, lease, store),
                    f"activator-{socket.gethostname()}-{os.getpid()}",
                    lifecycle=lifecycle,
                )
                public_server = _server(
                    activator_app,
                    self._activator_settings.host,
                    self._activator_settings,
                    timeout_s=self._activator_settings.exit_timeout_s,
                )
                public_task = await _start(public_server, public_sock, "activator")
            for name, loop in (
                ("activation-requests", orchestrator.run()),
                ("reaper", reaper.run()),
                ("autoscaler", autoscaler.run()),
            ):
                loops.append(asyncio.create_task(loop, name=name))
            if publisher is not None:
                loops.append(asyncio.create_task(publisher.run(), name="cloudwatch"))
            if self._demo:
                await self._register_demo(service)
            self._banner(admin_sock, public_sock)
            await stop.wait()
            logger.info("stopping")
        finally:
            if public_server is not None and public_task is not None:
                await _stop(
                    public_server, public_task, public_server.config.timeout_graceful_shutdown or 1
                )
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await orchestrator.close()
            if publisher is not None:
                await publisher.close()  # after the orchestrator: its last activations count
            await reaper.close()
            await placer.close()
            await backend.close()
            await lease.release()
            if admin_server is not None and admin_task is not None:
                await _stop(admin_server, admin_task, _ADMIN_STOP_TIMEOUT_S)
            await workers.close()
            await store.close()
            admin_sock.close()
            if public_sock is not None:
                public_sock.close()
            logger.info("stopped")

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

    async def _register_demo(self, service: AdminService) -> None:
        from data_plane.demo import DEMO_MODEL, write_demo_repository

        model_dir = await asyncio.to_thread(write_demo_repository, self._demo_dir)
        body = schemas.ModelCreate.model_validate(
            {"name": DEMO_MODEL, "storage_uri": str(model_dir), "scaling": {"min_replicas": 0}},
            context={"allowed_storage": self.settings.allowed_storage},
        )
        with contextlib.suppress(ModelExistsError):
            await service.register(body)

    def _banner(self, admin_sock: socket.socket, public_sock: socket.socket | None) -> None:
        admin = _url(admin_sock)
        lines = [f"zeroserve: admin API {admin}/admin/v1 (state {self.settings.state_url})"]
        if public_sock is not None:
            public = _url(public_sock)
            lines.insert(0, f"zeroserve: serving models at {public}/v2/models/<name>/infer")
            if self._demo:
                from data_plane.demo import DEMO_MODEL

                lines.append(
                    f"demo model '{DEMO_MODEL}' registered (scaled to zero); try:\n"
                    f"  curl -s -X POST {public}/v2/models/{DEMO_MODEL}/infer"
                    ' -d \'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],'
                    '"data":[1,2,3,4]}]}\''
                )
        print("\n".join(lines), file=self._out, flush=True)


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _server(app: ASGIApp, host: str, limits: ServerLimits, *, timeout_s: float) -> _Server:
    config = http_config(
        app,
        limits,
        host=host,
        lifespan="on",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=max(int(timeout_s), 1),
        backlog=2048,
    )
    return _Server(config)


async def _start(server: _Server, sock: socket.socket, name: str) -> asyncio.Task[None]:
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"server-{name}")
    try:
        async with asyncio.timeout(_SERVER_START_TIMEOUT_S):
            while not server.started:
                if task.done():
                    break
                await asyncio.sleep(0.02)
    except TimeoutError:
        task.cancel()
        raise RuntimeError(
            f"the {name} server did not start within {_SERVER_START_TIMEOUT_S} s"
        ) from None
    if not server.started:
        with contextlib.suppress(BaseException):
            await task
        raise RuntimeError(f"the {name} server did not start (its startup failed; see the log)")
    return task


async def _stop(server: _Server, task: asyncio.Task[None], timeout_s: float) -> None:
    server.should_exit = True
    try:
        async with asyncio.timeout(timeout_s + 10):
            await asyncio.shield(task)
    except TimeoutError:
        server.force_exit = True
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    except BaseException:
        # A server that failed while running must not keep the rest from stopping.
        logger.exception("server stopped with an error")


def serve(
    settings: ControlPlaneSettings,
    activator_settings: ActivatorSettings | None,
    *,
    demo: bool = False,
    out: TextIO = sys.stdout,
    knative: KnativeSettings | None = None,
) -> int:
    """Run the platform until SIGINT or SIGTERM; a second signal kills the workers at once."""
    platform = Platform(settings, activator_settings, demo=demo, out=out, knative=knative)
    # One line per proxied request and per probe would drown the log (and cost time).
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = 0

        def on_signal() -> None:
            nonlocal signals
            signals += 1
            if signals == 1:
                stop.set()
                return
            print("zeroserve: second signal, killing workers", file=sys.stderr, flush=True)
            platform.kill_workers_now()
            os._exit(130)

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        await platform.run(stop)

    runner_kwargs: dict[str, Any] = {}
    with contextlib.suppress(ImportError):
        import uvloop

        runner_kwargs["loop_factory"] = uvloop.new_event_loop
    with asyncio.Runner(**runner_kwargs) as runner:
        runner.run(main())
    return 0


def default_repository(cache_dir: Path) -> Path:
    """The empty model repository local workers start with."""
    return cache_dir / "workers" / "repository"
