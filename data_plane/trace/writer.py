"""Writing traces to disk off the event loop: a bounded queue of writes and one thread.

`TraceFile` is Triton's trace file: traces written as they are flushed to ``<file>`` itself
(one JSON array, opened with ``[`` at the first write and closed with ``]`` when the server
stops, so it is whole only then, as in Triton), or each flush to its own complete array in
``<file>.<n>``, ``n`` counting from 0 for the life of the server.

`TraceWriter` runs the writes, in order, on one thread of its own. At most ``bound`` writes
wait; past that a write is dropped and logged, and a write that fails (a full disk, a
missing folder) is logged and dropped too: tracing never holds up or fails a request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import IO

from data_plane.trace.record import TraceRecord, encode_entries

logger = logging.getLogger(__name__)

_DROP_LOG_INTERVAL_S = 10.0


class TraceWriter:
    """Runs file writes in order on one thread, ``bound`` of them waiting at most."""

    def __init__(self, *, bound: int) -> None:
        self._slots = threading.BoundedSemaphore(bound)
        self._bound = bound
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._last: concurrent.futures.Future[None] | None = None
        self._dropped = 0
        self._dropped_logged_at = -_DROP_LOG_INTERVAL_S

    @property
    def dropped(self) -> int:
        """Writes dropped because ``bound`` were already waiting."""
        return self._dropped

    def submit(self, write: Callable[[], None], what: str) -> None:
        """Queue ``write``; drop it (and log) when ``bound`` writes already wait."""
        if not self._slots.acquire(blocking=False):
            self._dropped += 1
            now = time.monotonic()
            if now - self._dropped_logged_at >= _DROP_LOG_INTERVAL_S:
                self._dropped_logged_at = now
                logger.warning(
                    "trace writes are behind (%d waiting): dropped %s (%d dropped so far)",
                    self._bound,
                    what,
                    self._dropped,
                )
            return
        if self._executor is None:
            # Started at the first write: most servers never trace.
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="trace-writer"
            )
        self._last = self._executor.submit(self._run, write, what)

    def _run(self, write: Callable[[], None], what: str) -> None:
        try:
            write()
        except OSError as exc:
            logger.error("failed writing %s: %s", what, exc)
        except Exception:
            logger.exception("failed writing %s", what)
        finally:
            self._slots.release()

    async def close(self, *, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the queued writes, then stop the thread."""
        executor, last = self._executor, self._last
        if executor is None:
            return
        self._executor = None
        if last is not None:
            try:
                await asyncio.wait_for(asyncio.wrap_future(last), timeout_s)
            except TimeoutError:
                logger.error("trace writes did not finish within %s s; some are lost", timeout_s)
        executor.shutdown(wait=False, cancel_futures=True)


class TraceFile:
    """Triton's trace file ``path`` and its numbered siblings, written through ``writer``."""

    def __init__(self, path: str, writer: TraceWriter) -> None:
        self.path = path
        self._writer = writer
        self._next_index = 0
        # Touched only on the writer's thread.
        self._stream: IO[bytes] | None = None

    def append(self, records: list[TraceRecord]) -> None:
        """Add ``records`` to the array in :attr:`path`."""
        self._writer.submit(
            lambda: self._append(records), f"{len(records)} trace(s) to {self.path}"
        )

    def write_numbered(self, records: list[TraceRecord]) -> None:
        """Write ``records`` as a whole array to the next ``<path>.<n>``."""
        path = f"{self.path}.{self._next_index}"
        self._next_index += 1
        self._writer.submit(
            lambda: _write_whole(path, records), f"{len(records)} trace(s) to {path}"
        )

    def close(self) -> None:
        """End the array in :attr:`path`, if anything was written to it."""
        self._writer.submit(self._close, f"the end of {self.path}")

    def _append(self, records: list[TraceRecord]) -> None:
        body = encode_entries(records)
        if self._stream is None:
            self._stream = open(self.path, "wb")
            self._stream.write(b"[" + body)
        else:
            self._stream.write(b"," + body)
        self._stream.flush()

    def _close(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            try:
                stream.write(b"]")
            finally:
                stream.close()


def _write_whole(path: str, records: list[TraceRecord]) -> None:
    body = encode_entries(records)
    with open(path, "wb") as stream:
        stream.write(b"[" + body + b"]")
