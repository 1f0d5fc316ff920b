"""The data plane's gRPC listener, in process, over a data-plane core: both run on an
event loop of their own in a thread, so blocking clients (tritonclient.grpc) can call it
from the test's thread."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_plane.grpc.server import grpc_listener
from foundation.grpc_limits import GrpcLimits
from tests.data_plane.server_app import Core, data_plane_core
from tests.loop_thread import on_loop_thread

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

    @asynccontextmanager
    async def listening() -> AsyncIterator[tuple[int, Core]]:
        async with data_plane_core(repo, cache_dir, **core_options) as core:
            listener = grpc_listener(
                lambda: core.handlers,
                limits or limits_under_test(),
                host="127.0.0.1",
                port=0,
                drain_timeout_s=5.0,
            )
            async with listener as port:
                yield port, core

    with on_loop_thread(
        listening,
        what="the gRPC listener",
        start_timeout_s=START_TIMEOUT_S,
        stop_timeout_s=STOP_TIMEOUT_S,
    ) as ((port, core), loop):
        yield GrpcServing(port, core, loop)
