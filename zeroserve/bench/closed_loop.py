"""Closed-loop load: N connections, each sending its next request as soon as it has an answer.

Every request's send and completion times are recorded; the level's figures count the
answers that complete inside the timed window (after the warm-up, which runs the same load
on the same connections), as perf_analyzer counts them. A connection that fails is replaced
(after a short pause if it could not connect) so that the concurrency holds; each failure
is counted by kind. After the window no request is started, and those in flight are waited
for, up to the request timeout, so that every connection ends idle.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from dataclasses import dataclass
from typing import Final

import numpy as np

from zeroserve.bench.client import Connection, Endpoint, abort_overdue, close_all, open_connection
from zeroserve.bench.sse import STREAM_ERROR, StreamMeter, StreamRecorder
from zeroserve.bench.stats import LatencySummary, LevelResult, count_errors

RECONNECT_PAUSE_S: Final = 0.1
"""After a failed connect, before the next try: a refused port must not spin the client."""


@dataclass(frozen=True)
class LoadPlan:
    """What both loops need: where, what to send, and for how long."""

    endpoint: Endpoint
    requests: tuple[bytes, ...]
    """Pre-built requests, sent in turn."""
    warmup_s: float
    duration_s: float
    timeout_s: float
    connect_timeout_s: float
    batch_size: int = 1
    is_stream: bool = False
    """The answers are SSE streams (``--stream``): each is read as it arrives, measured, and
    one that breaks off or reports an error counts as a ``stream`` error."""
    slot_requests: tuple[tuple[bytes, ...], ...] = ()
    """When given, the connection in slot ``k`` sends ``slot_requests[k]`` in turn instead
    of ``requests`` (shared memory: each connection's outputs go to its own window); a
    level may hold at most this many connections."""

    def requests_of(self, slot: int) -> tuple[bytes, ...]:
        return self.slot_requests[slot] if self.slot_requests else self.requests

    def check_slots(self, slots: int) -> None:
        """Raise ValueError when the plan has requests for fewer than ``slots`` slots."""
        if self.slot_requests and slots > len(self.slot_requests):
            raise ValueError(
                f"{slots} connections asked, the plan has requests for {len(self.slot_requests)}"
            )


def stream_done(recorder: StreamRecorder, connection: Connection, sent_ns: int, now: int) -> bool:
    """Record a 2xx answer's stream, if it is one; False when it counts as an error."""
    meter = connection.observer
    if not isinstance(meter, StreamMeter):
        return True
    if not meter.is_complete:
        return False
    recorder.record(meter, sent_ns, now)
    return True


class ClosedLoop:
    """One closed-loop level at a fixed concurrency; :meth:`run` once."""

    def __init__(self, plan: LoadPlan, concurrency: int) -> None:
        plan.check_slots(concurrency)
        self._plan = plan
        self._concurrency = concurrency
        self._next_request = 0
        self._done_ns = array("q")
        self._latency_ns = array("q")
        self._error_ns: list[int] = []
        self._error_kinds: list[str] = []
        self._error_samples: dict[str, str] = {}
        self._streams = StreamRecorder()
        self._connections: set[Connection] = set()
        self._busy = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._all_idle: asyncio.Event | None = None
        self.opened = 0
        self.started_ns = 0
        self.window_start_ns = 0
        self.window_end_ns = 0

    @property
    def answered(self) -> int:
        """Requests finished so far (answers and failures, warm-up included)."""
        return len(self._done_ns) + len(self._error_ns)

    @property
    def failed(self) -> int:
        return len(self._error_ns)

    async def run(self) -> LevelResult:
        plan = self._plan
        self._all_idle = asyncio.Event()
        self.started_ns = time.perf_counter_ns()
        self.window_start_ns = self.started_ns + int(plan.warmup_s * 1e9)
        self.window_end_ns = self.window_start_ns + int(plan.duration_s * 1e9)
        watchdog = asyncio.create_task(
            abort_overdue(self._connections, self._plan.timeout_s), name="bench-closed-watchdog"
        )
        try:
            for slot in range(self._concurrency):
                self._spawn_connect(slot, pause_s=0.0)
            await asyncio.sleep(max(self.window_end_ns - time.perf_counter_ns(), 0) / 1e9)
            if self._busy:
                self._all_idle.clear()
                try:
                    async with asyncio.timeout(plan.timeout_s + 1.0):
                        await self._all_idle.wait()
                except TimeoutError:
                    pass
        finally:
            await close_all(watchdog, self._tasks, self._connections)
        return self._result()

    # -- ResponseSink ---------------------------------------------------------------------

    def on_response(self, connection: Connection, tag: int, status: int) -> None:
        now = time.perf_counter_ns()
        self._busy -= 1
        if not 200 <= status < 300:
            self._error(now, f"http_{status}", connection.error_sample)
        elif stream_done(self._streams, connection, connection.sent_ns, now):
            self._done_ns.append(now)
            self._latency_ns.append(now - connection.sent_ns)
        else:
            self._error(now, STREAM_ERROR, b"")
        if now < self.window_end_ns:
            if connection.is_reusable:
                self._send(connection, now)
            # Otherwise it is closing (no keep-alive): on_closed replaces it.
        elif self._busy == 0 and self._all_idle is not None:
            self._all_idle.set()

    def on_failure(self, connection: Connection, tag: int, kind: str) -> None:
        self._busy -= 1
        self._error(time.perf_counter_ns(), kind, b"")
        if self._busy == 0 and self._all_idle is not None:
            if time.perf_counter_ns() >= self.window_end_ns:
                self._all_idle.set()

    def on_closed(self, connection: Connection) -> None:
        self._connections.discard(connection)
        if time.perf_counter_ns() < self.window_end_ns:
            self._spawn_connect(connection.slot, pause_s=0.0)

    # -- internals ------------------------------------------------------------------------

    def _send(self, connection: Connection, now: int) -> None:
        requests = self._plan.requests_of(connection.slot)
        index = self._next_request
        self._next_request = index + 1 if index + 1 < len(requests) else 0
        self._busy += 1
        connection.send(requests[index], index, now)

    def _error(self, now: int, kind: str, sample: bytes) -> None:
        self._error_ns.append(now)
        self._error_kinds.append(kind)
        if sample and kind not in self._error_samples:
            self._error_samples[kind] = sample.decode("utf-8", errors="replace")

    def _spawn_connect(self, slot: int, pause_s: float) -> None:
        task = asyncio.ensure_future(self._connect(slot, pause_s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, slot: int, pause_s: float) -> None:
        plan = self._plan
        while time.perf_counter_ns() < self.window_end_ns:
            if pause_s:
                await asyncio.sleep(pause_s)
            try:
                connection = await open_connection(
                    plan.endpoint,
                    self,
                    plan.connect_timeout_s,
                    StreamMeter() if plan.is_stream else None,
                    slot,
                )
            except (OSError, TimeoutError):
                self._error(time.perf_counter_ns(), "connect", b"")
                pause_s = RECONNECT_PAUSE_S
                continue
            self.opened += 1
            self._connections.add(connection)
            now = time.perf_counter_ns()
            if now < self.window_end_ns:
                self._send(connection, now)
            return

    def _result(self) -> LevelResult:
        start, end = self.window_start_ns, self.window_end_ns
        done = np.frombuffer(self._done_ns, dtype=np.int64)
        latency = np.frombuffer(self._latency_ns, dtype=np.int64)
        in_window = (done >= start) & (done < end)
        error_ns = np.asarray(self._error_ns, dtype=np.int64)
        kinds = [
            kind for kind, at in zip(self._error_kinds, error_ns, strict=True) if start <= at < end
        ]
        duration_s = (end - start) / 1e9
        ok = int(np.count_nonzero(in_window))
        return LevelResult(
            mode="concurrency",
            level=float(self._concurrency),
            duration_s=duration_s,
            ok=ok,
            errors=count_errors(kinds),
            throughput=ok / duration_s,
            latency=LatencySummary.from_ns(latency[in_window]),
            batch_size=self._plan.batch_size,
            connections=self.opened,
            error_samples=dict(self._error_samples),
            stream=self._streams.summary(start, end, duration_s) if self._plan.is_stream else None,
        )
