"""Open-loop load: Poisson arrivals at a fixed rate, latency counted from the scheduled send.

A closed loop waits for an answer before it sends again, so a slow answer also delays the
requests behind it, and their wait is never recorded ("coordinated omission"). Here every
send time is drawn before the run (exponential gaps, seeded: :func:`poisson_schedule`), and
each request's latency runs from its *scheduled* time to the last byte of its answer, as
wrk2 and perf_analyzer's ``--request-rate-range`` measure it. A request goes out on an idle
connection; with none idle it waits, its latency running, while a new one opens (up to
``max_connections``). The event loop's timers have about a millisecond of granularity, so a
request may go out up to :data:`SEND_SLACK_NS` early rather than the client spinning; its
latency then runs from the actual send, and the send lag is reported.

The figures count the requests *scheduled* inside the timed window: latency, errors and
``offered_rate`` over them; ``throughput`` is successful answers *completed* inside it. A
request still unanswered ``timeout_s`` after the last send counts as a ``timeout``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Final

import numpy as np

from zeroserve.bench.client import Connection, abort_overdue, close_all, open_connection
from zeroserve.bench.closed_loop import LoadPlan, stream_done
from zeroserve.bench.sse import STREAM_ERROR, StreamMeter, StreamRecorder
from zeroserve.bench.stats import LatencySummary, LevelResult, count_errors

SEND_SLACK_NS: Final = 500_000
"""Send this early at most: half the event loop's timer granularity."""
INITIAL_CONNECTIONS: Final = 4
_START_DELAY_NS: Final = 20_000_000
"""The schedule starts this long after the connections are up, so its first sends are not
late because of set-up."""


def poisson_schedule(rate: float, span_s: float, seed: int) -> np.ndarray:
    """Send offsets in nanoseconds from the start, in ``[0, span_s)``: Poisson arrivals at
    ``rate`` per second (exponential gaps), the same for the same ``seed``."""
    if rate <= 0 or span_s <= 0:
        raise ValueError("rate and span_s must be > 0")
    rng = np.random.default_rng(seed)
    # Enough gaps that running out before span_s is vanishingly unlikely; topped up if not.
    expected = rate * span_s
    offsets = np.cumsum(rng.exponential(1.0 / rate, size=int(expected + 6 * expected**0.5) + 16))
    while offsets[-1] < span_s:
        more = np.cumsum(rng.exponential(1.0 / rate, size=int(expected) + 16)) + offsets[-1]
        offsets = np.concatenate([offsets, more])
    offsets = offsets[offsets < span_s]
    return np.asarray(offsets * 1e9, dtype=np.int64)


class OpenLoop:
    """One open-loop level at a fixed rate; :meth:`run` once."""

    def __init__(self, plan: LoadPlan, rate: float, *, seed: int, max_connections: int) -> None:
        self._plan = plan
        self._rate = rate
        if plan.slot_requests:
            max_connections = min(max_connections, len(plan.slot_requests))
        self._max_connections = max_connections
        # A connection takes a free slot when it opens and gives it back when it closes.
        self._free_slots: deque[int] = deque(range(max_connections))
        self._offsets = poisson_schedule(rate, plan.warmup_s + plan.duration_s, seed)
        count = len(self._offsets)
        self._sent_ns = np.zeros(count, dtype=np.int64)
        self._done_ns = np.zeros(count, dtype=np.int64)
        self._status = np.zeros(count, dtype=np.int16)
        self._error_kind: dict[int, str] = {}
        self._error_samples: dict[str, str] = {}
        self._streams = StreamRecorder()
        self._idle: deque[Connection] = deque()
        # Requests waiting for a connection. Bounded by the schedule's length, which is
        # fixed before the run; the wait is part of their latency, never dropped.
        self._waiting: deque[int] = deque()
        self._connections: set[Connection] = set()
        self._connecting = 0
        self._outstanding = 0
        self._is_all_sent = False
        self._drained: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.opened = 0
        self.answered = 0
        self.failed = 0
        self.started_ns = 0
        self.window_start_ns = 0
        self.window_end_ns = 0

    async def run(self) -> LevelResult:
        plan = self._plan
        self._drained = asyncio.Event()
        initial = [
            self._spawn_connect() for _ in range(min(INITIAL_CONNECTIONS, self._max_connections))
        ]
        # Each connect is bounded by the connect timeout; this bound is only a backstop.
        await asyncio.wait(initial, timeout=plan.connect_timeout_s + 1.0)
        self.started_ns = time.perf_counter_ns() + _START_DELAY_NS
        self.window_start_ns = self.started_ns + int(plan.warmup_s * 1e9)
        self.window_end_ns = self.window_start_ns + int(plan.duration_s * 1e9)
        watchdog = asyncio.create_task(
            abort_overdue(self._connections, self._plan.timeout_s), name="bench-open-watchdog"
        )
        try:
            await self._dispatch_all()
            self._is_all_sent = True
            if self._outstanding:
                try:
                    async with asyncio.timeout(plan.timeout_s):
                        await self._drained.wait()
                except TimeoutError:
                    pass
        finally:
            await close_all(watchdog, self._tasks, self._connections)
        return self._result()

    async def _dispatch_all(self) -> None:
        start = self.started_ns
        offsets = self._offsets
        count = len(offsets)
        index = 0
        while index < count:
            now = time.perf_counter_ns()
            wait_ns = start + int(offsets[index]) - SEND_SLACK_NS - now
            if wait_ns > 0:
                # At least 1 ms: shorter timers run at once on uvloop and would spin.
                await asyncio.sleep(max(wait_ns, 1_000_000) / 1e9)
                continue
            while index < count and start + int(offsets[index]) - SEND_SLACK_NS <= now:
                self._dispatch(index)
                index += 1

    def _dispatch(self, index: int) -> None:
        self._outstanding += 1
        while self._idle:
            connection = self._idle.popleft()
            if connection.is_reusable:
                self._send(connection, index)
                return
        self._waiting.append(index)
        if len(self._connections) + self._connecting < self._max_connections:
            self._spawn_connect()

    def _send(self, connection: Connection, index: int) -> None:
        requests = self._plan.requests_of(connection.slot)
        connection.send(requests[index % len(requests)], index)
        self._sent_ns[index] = connection.sent_ns

    def _free(self, connection: Connection) -> None:
        if not connection.is_reusable:
            return
        if self._waiting:
            self._send(connection, self._waiting.popleft())
        else:
            self._idle.append(connection)

    # -- ResponseSink ---------------------------------------------------------------------

    def on_response(self, connection: Connection, tag: int, status: int) -> None:
        index = tag
        now = time.perf_counter_ns()
        self._done_ns[index] = now
        self._status[index] = status
        if 200 <= status < 300 and not stream_done(
            self._streams, connection, int(self._sent_ns[index]), now
        ):
            # Not a success: kept out of the latency and throughput figures.
            self._status[index] = 0
            self.failed += 1
            self._error_kind[index] = STREAM_ERROR
        elif not 200 <= status < 300:
            self.failed += 1
            self._error_kind[index] = f"http_{status}"
            kind = f"http_{status}"
            if connection.error_sample and kind not in self._error_samples:
                self._error_samples[kind] = connection.error_sample.decode(
                    "utf-8", errors="replace"
                )
        self._finish()
        self._free(connection)

    def on_failure(self, connection: Connection, tag: int, kind: str) -> None:
        self.failed += 1
        self._error_kind[tag] = kind
        self._finish()

    def on_closed(self, connection: Connection) -> None:
        if connection.slot not in self._free_slots:
            self._free_slots.append(connection.slot)
        self._connections.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)
        if self._waiting and len(self._connections) + self._connecting < self._max_connections:
            self._spawn_connect()

    # -- internals ------------------------------------------------------------------------

    def _finish(self) -> None:
        self.answered += 1
        self._outstanding -= 1
        if self._is_all_sent and self._outstanding == 0 and self._drained is not None:
            self._drained.set()

    def _spawn_connect(self) -> asyncio.Task[None]:
        self._connecting += 1
        task = asyncio.ensure_future(self._connect(self._free_slots.popleft()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _connect(self, slot: int) -> None:
        plan = self._plan
        try:
            connection = await open_connection(
                plan.endpoint,
                self,
                plan.connect_timeout_s,
                StreamMeter() if plan.is_stream else None,
                slot,
            )
        except (OSError, TimeoutError):
            self._free_slots.append(slot)
            # The requests waiting for a connection cannot go out: each fails as ``connect``;
            # later ones ask for a new connection when they come, so the attempts stay
            # bounded by the request rate.
            while self._waiting:
                index = self._waiting.popleft()
                self.failed += 1
                self._error_kind[index] = "connect"
                self._finish()
            return
        finally:
            self._connecting -= 1
        self.opened += 1
        self._connections.add(connection)
        self._free(connection)

    def _result(self) -> LevelResult:
        plan = self._plan
        start = self.started_ns
        window_start = int(plan.warmup_s * 1e9)
        window_end = window_start + int(plan.duration_s * 1e9)
        offsets = self._offsets
        scheduled = (offsets >= window_start) & (offsets < window_end)
        answered = self._done_ns > 0
        good = answered & (self._status >= 200) & (self._status < 300)
        ok = scheduled & good
        kinds = [kind for index, kind in self._error_kind.items() if scheduled[index]]
        # Scheduled in the window, never answered nor failed: still out at the end.
        lost = scheduled & ~answered
        lost &= ~np.isin(np.arange(len(offsets)), list(self._error_kind))
        kinds += ["timeout"] * int(np.count_nonzero(lost))
        intended = start + offsets[ok]
        sent = self._sent_ns[ok]
        done = self._done_ns[ok]
        completed = good & (self._done_ns >= start + window_start)
        completed &= self._done_ns < start + window_end
        duration_s = plan.duration_s
        lag_ms = (sent - intended) / 1e6
        return LevelResult(
            mode="rate",
            level=self._rate,
            duration_s=duration_s,
            ok=int(np.count_nonzero(ok)),
            errors=count_errors(kinds),
            throughput=int(np.count_nonzero(completed)) / duration_s,
            latency=LatencySummary.from_ns(done - np.minimum(intended, sent)),
            batch_size=plan.batch_size,
            service_latency=LatencySummary.from_ns(done - sent),
            offered_rate=int(np.count_nonzero(scheduled)) / duration_s,
            send_lag_p99_ms=float(np.percentile(lag_ms, 99)) if lag_ms.size else None,
            connections=self.opened,
            error_samples=dict(self._error_samples),
            stream=(
                self._streams.summary(start + window_start, start + window_end, duration_s)
                if plan.is_stream
                else None
            ),
        )
