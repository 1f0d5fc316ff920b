"""Open-loop load: Poisson arrivals at a fixed rate, latency counted from the intended send.

A closed loop (``bench.loadgen``: N connections, one request each at a time) waits for an
answer before it sends the next request, so a slow answer delays the requests behind it and
they never record the wait ("coordinated omission"). Here the send times are drawn up front
(exponential gaps, seeded) and each request's latency runs from its *intended* send time to
the last byte of its answer, as wrk2 measures. wrk2 is not packaged by Debian or Ubuntu, so
this generator stands in for it.

It runs in this process on one event loop (uvloop when installed) with one
``asyncio.Protocol`` per keep-alive connection, so a request costs one ``write`` and one
``data_received`` callback: no task, no stream objects. A request goes out on an idle
connection; with none idle it waits (its latency still running) while a new connection opens,
up to ``max_connections``. uvloop's timers have millisecond granularity, so requests are
sent up to ``_SLACK_NS`` before their intended time rather than spinning the CPU; the signed
send lag is reported, and an early request's latency runs from its actual send. The garbage
collector is off during a run. Answers must carry ``Content-Length`` (both uvicorn and the
activator send it for infer answers); chunked ones are counted as ``protocol`` errors.
"""

from __future__ import annotations

import asyncio
import gc
import resource
import time
from collections import deque
from dataclasses import dataclass
from typing import Final, cast

import numpy as np

from bench.loadgen import Target
from bench.models import RequestBody

_SLACK_NS: Final = 500_000
"""Send this early at most: half of uvloop's 1 ms timer granularity."""
_INITIAL_CONNECTIONS: Final = 4
_DRAIN_TIMEOUT_S: Final = 10.0
"""How long answers may take after the last send before they count as ``timeout`` errors."""


@dataclass(frozen=True)
class OpenLoopResult:
    """One timed run at a fixed offered rate (the warm-up's requests excluded)."""

    offered_rate: float
    """Requests per second asked for."""
    scheduled: int
    """Requests whose intended send fell in the timed window."""
    ok: int
    """Of those, answered 2xx/3xx."""
    errors: dict[str, int]
    duration_s: float
    throughput: float
    """2xx/3xx answers completed inside the timed window, per second."""
    p50_ms: float
    """Latency from the intended send time (or the actual one, when earlier) to the answer."""
    p90_ms: float
    p99_ms: float
    p999_ms: float
    mean_ms: float
    max_ms: float
    service_p50_ms: float
    """Latency from the actual send: what a closed-loop client would report."""
    service_p99_ms: float
    send_lag_p50_ms: float
    """Actual minus intended send time (negative: sent early, by at most the slack)."""
    send_lag_p99_ms: float
    connections: int
    """Connections opened (the most in use at once, plus the initial ones)."""
    client_cpu_cores: float
    """CPU this process used, per wall-clock second of the whole run (warm-up included)."""

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


def run_open_loop(
    target: Target,
    body: RequestBody,
    *,
    rate: float,
    duration_s: float,
    warmup_s: float,
    seed: int,
    max_connections: int = 256,
) -> OpenLoopResult:
    """Post ``body`` to ``target`` at ``rate`` Poisson arrivals per second."""
    if rate <= 0 or duration_s <= 0 or warmup_s < 0:
        raise ValueError("rate and duration_s must be > 0, warmup_s >= 0")
    rng = np.random.default_rng(seed)
    span_s = warmup_s + duration_s
    gaps = rng.exponential(1.0 / rate, size=int(rate * span_s * 1.5) + 100)
    offsets = np.cumsum(gaps)
    offsets = offsets[offsets < span_s]
    intended_ns = (offsets * 1e9).astype(np.int64)
    request = _request_bytes(target, body)
    gc.collect()
    gc.disable()
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    try:
        run = _Run(target, request, intended_ns, max_connections)
        _run_loop(run)
    finally:
        gc.enable()
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return run.result(rate, warmup_s, duration_s, cpu_s / wall_s)


def _request_bytes(target: Target, body: RequestBody) -> bytes:
    head = (
        f"POST {target.path} HTTP/1.1\r\nHost: {target.host}:{target.port}\r\n"
        f"Content-Type: {body.content_type}\r\nContent-Length: {len(body.body)}\r\n"
    )
    if body.header_length is not None:
        head += f"Inference-Header-Content-Length: {body.header_length}\r\n"
    return (head + "\r\n").encode() + body.body


def _run_loop(run: _Run) -> None:
    try:
        import uvloop

        uvloop.run(run.main())
    except ImportError:
        asyncio.run(run.main())


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, run: _Run) -> None:
        self._run = run
        self._buffer = bytearray()
        self._expected = -1
        self._status = 0
        self.transport: asyncio.Transport | None = None
        self.index = -1
        """The request in flight, or -1."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, though they implement it.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, index: int, request: bytes) -> None:
        assert self.transport is not None
        self.index = index
        self._run.sent_ns[index] = time.perf_counter_ns()
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        if self.index < 0:
            # Nothing asked: a server closing an idle connection may say why first.
            if self.transport is not None:
                self.transport.close()
            return
        self._buffer += data
        if self._expected < 0:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._buffer[:end]).lower()
            self._status = int(head[9:12])
            at = head.find(b"\r\ncontent-length:")
            if at < 0:
                self._fail("protocol")
                return
            value_end = head.find(b"\r\n", at + 17)
            length = int(head[at + 17 : value_end if value_end >= 0 else len(head)])
            self._expected = end + 4 + length
        if len(self._buffer) < self._expected:
            return
        index, status = self.index, self._status
        del self._buffer[: self._expected]
        self._expected, self.index = -1, -1
        self._run.completed(self, index, status)

    def connection_lost(self, exc: Exception | None) -> None:
        self._run.lost(self)

    def _fail(self, kind: str) -> None:
        index, self.index = self.index, -1
        self._run.failed(index, kind)
        if self.transport is not None:
            self.transport.close()


class _Run:
    """The schedule, the connection pool and the per-request timestamps of one run."""

    def __init__(
        self, target: Target, request: bytes, intended_ns: np.ndarray, max_connections: int
    ) -> None:
        self._target = target
        self._request = request
        self.intended_ns = intended_ns
        count = len(intended_ns)
        self.sent_ns = np.zeros(count, dtype=np.int64)
        self.done_ns = np.zeros(count, dtype=np.int64)
        self.status = np.zeros(count, dtype=np.int16)
        self.error_kind: dict[int, str] = {}
        self._max_connections = max_connections
        self._idle: deque[_Connection] = deque()
        self._waiting: deque[int] = deque()
        self._open = 0
        self._connecting = 0
        self.opened = 0
        self._outstanding = 0
        self._drained: asyncio.Event | None = None
        self._is_all_sent = False
        self.start_ns = 0

    async def main(self) -> None:
        self._drained = asyncio.Event()
        await asyncio.gather(*(self._connect() for _ in range(_INITIAL_CONNECTIONS)))
        intended = self.intended_ns
        count = len(intended)
        self.start_ns = time.perf_counter_ns() + 20_000_000
        start = self.start_ns
        index = 0
        while index < count:
            now = time.perf_counter_ns()
            wait_ns = start + int(intended[index]) - now - _SLACK_NS
            if wait_ns > 0:
                # At least 1 ms: uvloop runs shorter timers at once, which would spin.
                await asyncio.sleep(max(wait_ns, 1_000_000) / 1e9)
                continue
            while index < count and start + int(intended[index]) - _SLACK_NS <= now:
                self._dispatch(index)
                index += 1
        self._is_all_sent = True
        self._outstanding_check()
        try:
            await asyncio.wait_for(self._drained.wait(), _DRAIN_TIMEOUT_S)
        except TimeoutError:
            pass
        for connection in list(self._idle):
            if connection.transport is not None:
                connection.transport.close()
        # Let the transports close before the loop ends.
        await asyncio.sleep(0)

    def _dispatch(self, index: int) -> None:
        self._outstanding += 1
        if self._idle:
            self._idle.popleft().send(index, self._request)
            return
        self._waiting.append(index)
        if self._open + self._connecting < self._max_connections:
            asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        self._connecting += 1
        try:
            _, protocol = await loop.create_connection(
                lambda: _Connection(self), self._target.host, self._target.port
            )
        except OSError:
            self._connecting -= 1
            if self._waiting:
                self.failed(self._waiting.popleft(), "connect")
            return
        self._connecting -= 1
        self._open += 1
        self.opened += 1
        self._free(protocol)

    def _free(self, connection: _Connection) -> None:
        if self._waiting:
            connection.send(self._waiting.popleft(), self._request)
        else:
            self._idle.append(connection)

    def completed(self, connection: _Connection, index: int, status: int) -> None:
        self.done_ns[index] = time.perf_counter_ns()
        self.status[index] = status
        self._finish()
        self._free(connection)

    def failed(self, index: int, kind: str) -> None:
        if index >= 0:
            self.error_kind[index] = kind
            self._finish()

    def lost(self, connection: _Connection) -> None:
        self._open -= 1
        if connection in self._idle:
            self._idle.remove(connection)
        if connection.index >= 0:
            self.failed(connection.index, "read")
            connection.index = -1

    def _finish(self) -> None:
        self._outstanding -= 1
        self._outstanding_check()

    def _outstanding_check(self) -> None:
        if self._is_all_sent and self._outstanding == 0 and self._drained is not None:
            self._drained.set()

    def result(
        self, rate: float, warmup_s: float, duration_s: float, client_cpu_cores: float
    ) -> OpenLoopResult:
        window_start = int(warmup_s * 1e9)
        window_end = int((warmup_s + duration_s) * 1e9)
        timed = (self.intended_ns >= window_start) & (self.intended_ns < window_end)
        answered = self.done_ns > 0
        ok = timed & answered & (self.status >= 200) & (self.status < 400)
        errors = {"connect": 0, "read": 0, "protocol": 0, "status": 0, "timeout": 0}
        for index, kind in self.error_kind.items():
            if timed[index]:
                errors[kind] += 1
        errors["status"] = int(np.sum(timed & answered & ~ok))
        errors["timeout"] = int(np.sum(timed & ~answered)) - sum(
            1 for i in self.error_kind if timed[i]
        )
        intended = self.start_ns + self.intended_ns[ok]
        sent = self.sent_ns[ok]
        done = self.done_ns[ok]
        latency = (done - np.minimum(intended, sent)) / 1e6
        service = (done - sent) / 1e6
        lag = (sent - intended) / 1e6
        # Served throughput: answers that completed inside the window, whenever sent.
        completed_in_window = np.sum(
            answered
            & (self.done_ns >= self.start_ns + window_start)
            & (self.done_ns < self.start_ns + window_end)
            & (self.status >= 200)
            & (self.status < 400)
        )
        if latency.size == 0:
            latency = service = lag = np.zeros(1)
        p50, p90, p99, p999 = np.percentile(latency, [50, 90, 99, 99.9])
        s50, s99 = np.percentile(service, [50, 99])
        l50, l99 = np.percentile(lag, [50, 99])
        return OpenLoopResult(
            offered_rate=rate,
            scheduled=int(np.sum(timed)),
            ok=int(np.sum(ok)),
            errors=errors,
            duration_s=duration_s,
            throughput=float(completed_in_window) / duration_s,
            p50_ms=float(p50),
            p90_ms=float(p90),
            p99_ms=float(p99),
            p999_ms=float(p999),
            mean_ms=float(latency.mean()),
            max_ms=float(latency.max()),
            service_p50_ms=float(s50),
            service_p99_ms=float(s99),
            send_lag_p50_ms=float(l50),
            send_lag_p99_ms=float(l99),
            connections=self.opened,
            client_cpu_cores=client_cpu_cores,
        )
