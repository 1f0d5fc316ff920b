"""The one bootstrap of every zeroserve server process: listeners started, run until a
signal, and stopped together.

A process serves one or more listeners: `HttpListener` (uvicorn, under `ServerLimits`) and
any other async context manager that starts a server on entry and drains it on exit; a
server with ``async start()`` and ``async stop(grace)``, such as a ``grpc.aio`` server,
becomes one through `graceful`. They stop in the order STYLE C15 gives:

1. the first SIGINT or SIGTERM fails readiness (`Lifecycle.is_stopping`);
2. after ``propagation_s`` (0 where nothing routes by readiness) the listeners stop, the
   last started first: each stops accepting and drains what is in flight within its
   deadline, and an HTTP app's lifespan then releases what it holds (models, clients).

A second signal ends the propagation wait at once; once the listeners are stopping, a
second SIGINT stops the HTTP listeners without waiting for their requests (as uvicorn does
alone). `serve` does all of this for a process whose only parts are its listeners; a
process with more parts (``zeroserve up``) enters `StopSignals` and the listeners in an
``AsyncExitStack`` of its own, beside its other parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Protocol, Self, TypeVar, runtime_checkable

import uvicorn
from starlette.types import ASGIApp

from foundation.errors import ZeroserveError
from foundation.http import ServerLimits, http_config
from foundation.http_direct import DirectRoutes

__all__ = [
    "STOP_SIGNALS",
    "ForceStoppable",
    "GracefulServer",
    "HttpListener",
    "Lifecycle",
    "ServerStartError",
    "StopSignals",
    "bind_socket",
    "graceful",
    "run",
    "serve",
]

logger = logging.getLogger(__name__)

STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
"""What stops a server process: Ctrl-C, and a supervisor (Kubernetes, the local backend)."""

_T = TypeVar("_T")


@dataclass
class Lifecycle:
    """Whether a server is stopping: readiness fails once ``is_stopping`` is set, before
    connections stop (the routes and handlers of each app read it)."""

    is_stopping: bool = False


class ServerStartError(ZeroserveError):
    """A server did not come up: its app's startup failed, or it did not accept in time."""

    def __init__(self, *, server: str, reason: str) -> None:
        super().__init__(f"the {server} server did not start: {reason}")
        self.server = server
        self.reason = reason


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0 picks a port), not inheritable, for a listener
    to listen on. Binding first makes a port in use fail before anything else starts."""
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


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """Run ``main`` on a new event loop: uvloop's where it is installed (what uvicorn's
    ``loop="auto"`` picks when it owns the loop), else asyncio's."""
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop
    except ImportError:  # Windows, or a slim install
        pass
    else:
        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main)


@runtime_checkable
class ForceStoppable(Protocol):
    """A listener that can stop at once, without waiting for what is in flight."""

    def force_exit(self) -> None:
        """Stop waiting for in-flight work; the listener's exit then returns promptly."""


class _UvicornServer(uvicorn.Server):
    """uvicorn's server with signals left to the process (listeners share one loop), and
    a failed startup reported as an outcome, not a ``SystemExit`` out of the loop."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.accepting = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        except SystemExit:
            # uvicorn's answer to a failed lifespan startup (it logged why); serve() then
            # returns without serving, and the listener raises ServerStartError.
            self.should_exit = True
            return
        self.accepting.set()


class HttpListener:
    """One uvicorn HTTP server on a bound socket, under `ServerLimits`, as an async
    context manager.

    Entering runs the app's lifespan startup and returns once the server accepts (or raises
    `ServerStartError`); leaving stops accepting, waits up to ``drain_timeout_s`` for the
    requests in flight (then cancels them), and runs the lifespan's shutdown. The socket is
    the listener's from construction on and is closed when it stops.

    Parameters:
        app: the ASGI app; its lifespan runs (``lifespan="on"``).
        limits: the connection bounds (each server's settings are its `ServerLimits`).
        sock: from `bind_socket`.
        name: what the log and errors call the server ("data plane", "admin API").
        drain_timeout_s: how long in-flight requests may take once stopping.
        start_timeout_s: bound on the startup; None leaves it to the app's lifespan (the
            data plane loads its start-up models there, as long as they take).
        stop_timeout_s: bound on the whole stop, drain and lifespan shutdown included, after
            which the server is cancelled; None leaves it to the drain deadline and the
            app's lifespan.
        direct: routes answering their requests past ASGI (`foundation.http_direct`).
        options: uvicorn's ``Config`` options beyond these (``server_header``...).
    """

    def __init__(
        self,
        app: ASGIApp,
        limits: ServerLimits,
        sock: socket.socket,
        *,
        name: str,
        drain_timeout_s: float,
        start_timeout_s: float | None = None,
        stop_timeout_s: float | None = None,
        direct: DirectRoutes | None = None,
        **options: Any,
    ) -> None:
        config = http_config(
            app,
            limits,
            direct=direct,
            lifespan="on",
            log_config=None,
            access_log=False,
            backlog=2048,
            # uvicorn counts whole seconds; 0 would not wait at all.
            timeout_graceful_shutdown=max(int(drain_timeout_s), 1),
            **options,
        )
        self.name = name
        self._server = _UvicornServer(config)
        self._sock = sock
        self._address: tuple[str, int] = sock.getsockname()[:2]
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the socket (IPv6 hosts in brackets)."""
        host, port = self._address
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}"

    def force_exit(self) -> None:
        self._server.force_exit = True

    async def __aenter__(self) -> Self:
        server = self._server
        task = self._task = asyncio.create_task(
            server.serve(sockets=[self._sock]), name=f"server-{self.name}"
        )
        accepting = asyncio.create_task(server.accepting.wait())
        try:
            async with asyncio.timeout(self._start_timeout_s):
                await asyncio.wait({task, accepting}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            await self._cancel()
            raise ServerStartError(
                server=self.name, reason=f"not accepting within {self._start_timeout_s:g} s"
            ) from None
        except BaseException:
            await self._cancel()
            raise
        finally:
            accepting.cancel()
        if not server.accepting.is_set():
            error = None if task.cancelled() else task.exception()
            self._sock.close()
            raise ServerStartError(
                server=self.name, reason="its startup failed (see the log)"
            ) from error
        logger.info("%s server listening on %s", self.name, self.url)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        task = self._task
        assert task is not None, "the listener was not entered"
        self._server.should_exit = True
        try:
            async with asyncio.timeout(self._stop_timeout_s):
                await asyncio.shield(task)
        except TimeoutError:
            logger.error(
                "the %s server did not stop within %g s; cancelling it",
                self.name,
                self._stop_timeout_s,
            )
            await self._cancel()
        except Exception:
            # A server that failed while running must not keep the rest from stopping.
            logger.exception("the %s server stopped with an error", self.name)
        finally:
            self._sock.close()

    async def _cancel(self) -> None:
        if self._task is not None:
            self._server.force_exit = True
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._sock.close()


class GracefulServer(Protocol):
    """A server started and stopped by coroutines, its stop taking a grace period for what
    is in flight (``grpc.aio.Server`` is one)."""

    async def start(self) -> None:
        """Start serving; return once the server accepts."""

    async def stop(self, grace: float | None, /) -> object:
        """Stop accepting, give what is in flight ``grace`` seconds, then cancel it."""


@contextlib.asynccontextmanager
async def graceful(server: GracefulServer, *, grace_s: float) -> AsyncIterator[GracefulServer]:
    """``server`` as a listener: started on entry, stopped within ``grace_s`` on exit."""
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace_s)


class StopSignals:
    """SIGINT and SIGTERM for the servers of one process: the first fails readiness and,
    ``propagation_s`` later, sets `stop`; see the module's docstring for a second.

    Entered as a context manager on the running loop (in the main thread) it installs the
    handlers, and removes them on exit: enter it before the listeners, so that a signal
    while they drain still reaches it. ``on_repeat`` is called with each signal that comes
    once `stop` is set.
    """

    def __init__(
        self,
        lifecycle: Lifecycle,
        *,
        propagation_s: float = 0.0,
        on_repeat: Callable[[int], None] | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        self.stop = asyncio.Event()
        self._propagation_s = propagation_s
        self._on_repeat = on_repeat
        self._is_signalled = False
        self._propagation: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> Self:
        self._loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            self._loop.add_signal_handler(sig, self.handle, sig)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._propagation is not None:
            self._propagation.cancel()
        if self._loop is not None:
            for sig in STOP_SIGNALS:
                self._loop.remove_signal_handler(sig)

    def handle(self, sig: int) -> None:
        """What a stop signal does (the installed handler; tests call it directly)."""
        if self._is_signalled:
            if not self.stop.is_set():
                logger.info("second signal: stopping now")
                self._stop_now()
            elif self._on_repeat is not None:
                self._on_repeat(sig)
            return
        self._is_signalled = True
        # Readiness failing already (an engine died and the server signalled itself) has
        # nothing left to propagate for: its requests can only fail.
        was_stopping = self.lifecycle.is_stopping
        self.lifecycle.is_stopping = True
        if was_stopping or self._propagation_s <= 0:
            self._stop_now()
            return
        logger.info("readiness failed; stopping in %.1f s", self._propagation_s)
        loop = self._loop or asyncio.get_running_loop()
        self._propagation = loop.call_later(self._propagation_s, self._stop_now)

    def _stop_now(self) -> None:
        if self._propagation is not None:
            self._propagation.cancel()
            self._propagation = None
        self.stop.set()


async def serve(
    *listeners: AbstractAsyncContextManager[object],
    lifecycle: Lifecycle,
    propagation_s: float = 0.0,
) -> None:
    """Start ``listeners`` in order, serve until SIGINT or SIGTERM, then stop them, the
    last started first (a failed start stops those already started, likewise).

    ``lifecycle`` is the one the apps' readiness reads. A second SIGINT while stopping
    makes every `ForceStoppable` listener stop at once.
    """

    def on_repeat(sig: int) -> None:
        if sig == signal.SIGINT:
            for listener in listeners:
                if isinstance(listener, ForceStoppable):
                    listener.force_exit()

    async with contextlib.AsyncExitStack() as stack:
        signals = stack.enter_context(
            StopSignals(lifecycle, propagation_s=propagation_s, on_repeat=on_repeat)
        )
        for listener in listeners:
            await stack.enter_async_context(listener)
        await signals.stop.wait()
        logger.info("stopping")
