"""An async context entered on an event loop of its own in a thread, so that blocking
clients (grpcio, tritonclient) can call what it serves from the test's thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import TypeVar

__all__ = ["on_loop_thread"]

_T = TypeVar("_T")


@contextmanager
def on_loop_thread(
    make: Callable[[], AbstractAsyncContextManager[_T]],
    *,
    what: str,
    start_timeout_s: float,
    stop_timeout_s: float,
) -> Iterator[tuple[_T, asyncio.AbstractEventLoop]]:
    """``make()`` entered on a new loop in a thread: yields what it gives and that loop; on
    exit the context is left on its loop and the thread joined. A failure to start or to
    stop raises RuntimeError naming ``what``, with the thread's exception as its cause."""
    ready = threading.Event()
    started: list[tuple[_T, asyncio.AbstractEventLoop, asyncio.Event]] = []
    failure: list[BaseException] = []

    async def main() -> None:
        async with make() as value:
            stop = asyncio.Event()
            started.append((value, asyncio.get_running_loop(), stop))
            ready.set()
            await stop.wait()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # reported to the test's thread
            failure.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=run, name=what.replace(" ", "-"), daemon=True)
    thread.start()
    try:
        if not ready.wait(start_timeout_s):
            raise RuntimeError(f"{what} did not start within {start_timeout_s} s")
        if failure:
            raise RuntimeError(f"{what} failed to start") from failure[0]
        value, loop, _ = started[0]
        yield value, loop
    finally:
        if started:
            _, loop, stop = started[0]
            loop.call_soon_threadsafe(stop.set)
        thread.join(stop_timeout_s)
        if thread.is_alive():
            raise RuntimeError(f"{what} did not stop within {stop_timeout_s} s")
        if failure and started:
            raise RuntimeError(f"{what} failed") from failure[0]
