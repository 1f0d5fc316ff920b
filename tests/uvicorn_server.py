"""A uvicorn server run on the test's own event loop, for as long as a block runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import uvicorn

START_TIMEOUT_S = 30.0


@contextlib.asynccontextmanager
async def serving(server: uvicorn.Server) -> AsyncIterator[str]:
    """Serve ``server`` until the block ends; yields its loopback URL (its first socket)."""
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("server stopped during start-up")
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
