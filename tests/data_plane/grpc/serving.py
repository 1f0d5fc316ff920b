"""The data plane's gRPC listener, in process, over a data-plane core: both run on an
event loop of their own in a thread, so blocking clients (tritonclient.grpc) can call it
from the test's thread."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_plane.grpc.server import grpc_listener
from foundation.grpc_limits import GrpcLimits
from tests.data_plane.server_app import Core, data_plane_core

START_TIMEOUT_S = 120.0
FRONTEND_VARIABLE = "ZEROSERVE_DATA_PLANE_GRPC_FRONTEND"
"""Names the front end the gRPC tests serve with where they do not choose one (``aio`` or
``h2corn``; unset: `GrpcLimits`' default, h2corn), so the whole suite runs on either."""


def limits_under_test(**fields: Any) -> GrpcLimits:
    """`GrpcLimits` with ``fields``, on the front end :data:`FRONTEND_VARIABLE` names."""
    frontend = os.environ.get(FRONTEND_VARIABLE)
    if frontend and "grpc_frontend" not in fields:
        fields["grpc_frontend"] = frontend
    return GrpcLimits(**fields)


STOP_TIMEOUT_S = 30.0


@dataclass
class GrpcServing:
    """A running listener: where it listens and the core behind it (touch the core only
    through :meth:`call`, on the server's loop)."""

    port: int
    core: Core
    loop: asyncio.AbstractEventLoop
    _stop: asyncio.Event = field(repr=False)

    @property
    def address(self) -> str:
        """host:port, the form tritonclient and grpc channels take."""
        return f"127.0.0.1:{self.port}"

    def call(self, coroutine: Any, timeout_s: float = 60.0) -> Any:
        """Run ``coroutine`` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)


@contextmanager
def serving(
    repo: Path,
    cache_dir: Path,
    limits: GrpcLimits | None = None,
    **core_options: Any,
) -> Iterator[GrpcServing]:
    """A gRPC listener on a free port over ``data_plane_core(repo, cache_dir,
    **core_options)``; stopped, and the core closed, on exit."""
    ready = threading.Event()
    started: list[GrpcServing] = []
    failure: list[BaseException] = []

    async def main() -> None:
        async with data_plane_core(repo, cache_dir, **core_options) as core:
            listener = grpc_listener(
                lambda: core.handlers,
                limits or limits_under_test(),
                host="127.0.0.1",
                port=0,
                drain_timeout_s=5.0,
            )
            async with listener as port:
                stop = asyncio.Event()
                started.append(GrpcServing(port, core, asyncio.get_running_loop(), stop))
                ready.set()
                await stop.wait()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # reported to the test's thread
            failure.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="grpc-serving", daemon=True)
    thread.start()
    try:
        if not ready.wait(START_TIMEOUT_S):
            raise RuntimeError(f"the gRPC listener did not start within {START_TIMEOUT_S} s")
        if failure:
            raise RuntimeError("the gRPC listener failed to start") from failure[0]
        yield started[0]
    finally:
        if started:
            started[0].loop.call_soon_threadsafe(started[0]._stop.set)
        thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            raise RuntimeError(f"the gRPC listener did not stop within {STOP_TIMEOUT_S} s")
        if failure and started:
            raise RuntimeError("the gRPC listener failed") from failure[0]
