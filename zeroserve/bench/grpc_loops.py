"""Closed- and open-loop load over gRPC: the HTTP loops' measurements, with calls in place of
connections.

A *slot* carries one call at a time: in the closed loop each of the N slots sends its next
call as soon as the last one is answered; in the open loop calls go out at their Poisson
times on whichever slot is free (at most ``max_in_flight``), a call with none free waiting,
its latency running. Slot ``k`` calls on channel ``k // streams_per_connection``
(:class:`~zeroserve.bench.grpc_client.ChannelSet`), so the concurrency is spread over as
many HTTP/2 connections as it needs. Windows, warm-up, what is counted and the result are
the HTTP loops' (:mod:`zeroserve.bench.closed_loop`, :mod:`zeroserve.bench.open_loop`);
a failed call counts under its status code (``grpc_unavailable``, ``grpc_deadline_exceeded``
for a call past ``timeout_s``...). After an UNAVAILABLE answer a slot pauses before its
next call, so that a server that went away does not spin the client.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from dataclasses import dataclass

import grpc
import numpy as np

from zeroserve.bench.closed_loop import RECONNECT_PAUSE_S
from zeroserve.bench.grpc_client import ChannelSet, GrpcTarget, error_kind
from zeroserve.bench.open_loop import SEND_SLACK_NS, poisson_schedule
from zeroserve.bench.stats import LatencySummary, LevelResult, count_errors

_START_DELAY_NS = 20_000_000


@dataclass(frozen=True)
class GrpcLoadPlan:
    """What both gRPC loops need: where, what to send, and for how long."""

    target: GrpcTarget
    requests: tuple[bytes, ...]
    """Serialized ModelInferRequests, sent in turn."""
    warmup_s: float
    duration_s: float
    timeout_s: float
    streams_per_connection: int = 8
    batch_size: int = 1
    slot_requests: tuple[tuple[bytes, ...], ...] = ()
    """When given, slot ``k`` sends ``slot_requests[k]`` in turn instead of ``requests``
    (shared memory: each slot's outputs go to its own window); a level may use at most
    this many slots."""

    def requests_of(self, slot: int) -> tuple[bytes, ...]:
        return self.slot_requests[slot] if self.slot_requests else self.requests

    def check_slots(self, slots: int) -> None:
        if self.slot_requests and slots > len(self.slot_requests):
            raise ValueError(
                f"{slots} slots asked, the plan has requests for {len(self.slot_requests)}"
            )


class _Errors:
    """Failed calls: when, of what kind, and one message per kind."""

    def __init__(self) -> None:
        self.at_ns: list[int] = []
        self.kinds: list[str] = []
        self.samples: dict[str, str] = {}

    def add(self, now: int, error: grpc.aio.AioRpcError) -> str:
        kind = error_kind(error.code())
        self.at_ns.append(now)
        self.kinds.append(kind)
        if kind not in self.samples:
            self.samples[kind] = error.details() or ""
        return kind


class GrpcClosedLoop:
    """One closed-loop level at a fixed concurrency; :meth:`run` once."""

    def __init__(self, plan: GrpcLoadPlan, concurrency: int) -> None:
        plan.check_slots(concurrency)
        self._plan = plan
        self._concurrency = concurrency
        self._channels = ChannelSet(plan.target, plan.streams_per_connection)
        self._done_ns = array("q")
        self._latency_ns = array("q")
        self._errors = _Errors()
        self.started_ns = 0
        self.window_start_ns = 0
        self.window_end_ns = 0

    @property
    def answered(self) -> int:
        return len(self._done_ns) + len(self._errors.at_ns)

    @property
    def failed(self) -> int:
        return len(self._errors.at_ns)

    async def run(self) -> LevelResult:
        plan = self._plan
        self.started_ns = time.perf_counter_ns()
        self.window_start_ns = self.started_ns + int(plan.warmup_s * 1e9)
        self.window_end_ns = self.window_start_ns + int(plan.duration_s * 1e9)
        slots = [
            asyncio.create_task(self._slot(slot), name=f"bench-grpc-slot-{slot}")
            for slot in range(self._concurrency)
        ]
        try:
            # A slot sends nothing after the window; its last call ends by its deadline.
            await asyncio.wait(slots, timeout=plan.warmup_s + plan.duration_s + plan.timeout_s + 1)
        finally:
            for task in slots:
                task.cancel()
            await asyncio.gather(*slots, return_exceptions=True)
            await self._channels.close()
        return self._result()

    async def _slot(self, slot: int) -> None:
        plan = self._plan
        infer = self._channels.infer(slot)
        requests = plan.requests_of(slot)
        index = slot % len(requests)
        timeout_s = plan.timeout_s
        while True:
            sent = time.perf_counter_ns()
            if sent >= self.window_end_ns:
                return
            try:
                await infer(requests[index], timeout=timeout_s)
            except grpc.aio.AioRpcError as error:
                if self._errors.add(time.perf_counter_ns(), error) == "grpc_unavailable":
                    await asyncio.sleep(RECONNECT_PAUSE_S)
            else:
                now = time.perf_counter_ns()
                self._done_ns.append(now)
                self._latency_ns.append(now - sent)
            index = index + 1 if index + 1 < len(requests) else 0

    def _result(self) -> LevelResult:
        start, end = self.window_start_ns, self.window_end_ns
        done = np.frombuffer(self._done_ns, dtype=np.int64)
        latency = np.frombuffer(self._latency_ns, dtype=np.int64)
        in_window = (done >= start) & (done < end)
        kinds = [
            kind
            for kind, at in zip(self._errors.kinds, self._errors.at_ns, strict=True)
            if start <= at < end
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
            connections=self._channels.opened,
            error_samples=dict(self._errors.samples),
        )


class GrpcOpenLoop:
    """One open-loop level at a fixed rate; :meth:`run` once."""

    def __init__(self, plan: GrpcLoadPlan, rate: float, *, seed: int, max_in_flight: int) -> None:
        slots = min(max_in_flight, len(plan.slot_requests) or max_in_flight)
        self._plan = plan
        self._rate = rate
        self._slots = slots
        self._channels = ChannelSet(plan.target, plan.streams_per_connection)
        self._offsets = poisson_schedule(rate, plan.warmup_s + plan.duration_s, seed)
        count = len(self._offsets)
        self._sent_ns = np.zeros(count, dtype=np.int64)
        self._done_ns = np.zeros(count, dtype=np.int64)
        self._failed = np.zeros(count, dtype=np.bool_)
        self._errors = _Errors()
        self._error_of: dict[int, str] = {}
        # Calls due but waiting for a free slot; bounded by the schedule's length.
        self._due: asyncio.Queue[int] = asyncio.Queue(maxsize=count + 1)
        self._outstanding = 0
        self._is_all_sent = False
        self._drained: asyncio.Event | None = None
        self.answered = 0
        self.failed = 0
        self.started_ns = 0
        self.window_start_ns = 0
        self.window_end_ns = 0

    async def run(self) -> LevelResult:
        plan = self._plan
        self._drained = asyncio.Event()
        slots = [
            asyncio.create_task(self._slot(slot), name=f"bench-grpc-slot-{slot}")
            for slot in range(self._slots)
        ]
        self.started_ns = time.perf_counter_ns() + _START_DELAY_NS
        self.window_start_ns = self.started_ns + int(plan.warmup_s * 1e9)
        self.window_end_ns = self.window_start_ns + int(plan.duration_s * 1e9)
        try:
            await self._dispatch_all()
            self._is_all_sent = True
            if self._outstanding:
                # Calls in flight end by their deadline; those still queued get this long.
                try:
                    async with asyncio.timeout(plan.timeout_s + 1):
                        await self._drained.wait()
                except TimeoutError:
                    pass
        finally:
            for task in slots:
                task.cancel()
            await asyncio.gather(*slots, return_exceptions=True)
            await self._channels.close()
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
                await asyncio.sleep(max(wait_ns, 1_000_000) / 1e9)
                continue
            while index < count and start + int(offsets[index]) - SEND_SLACK_NS <= now:
                self._outstanding += 1
                self._due.put_nowait(index)
                index += 1

    async def _slot(self, slot: int) -> None:
        plan = self._plan
        requests = plan.requests_of(slot)
        infer = None
        while True:
            index = await self._due.get()
            if infer is None:
                infer = self._channels.infer(slot)
            sent = time.perf_counter_ns()
            self._sent_ns[index] = sent
            try:
                await infer(requests[index % len(requests)], timeout=plan.timeout_s)
            except grpc.aio.AioRpcError as error:
                self._failed[index] = True
                self._error_of[index] = self._errors.add(time.perf_counter_ns(), error)
                self.failed += 1
            else:
                self._done_ns[index] = time.perf_counter_ns()
            self.answered += 1
            self._outstanding -= 1
            if self._is_all_sent and self._outstanding == 0 and self._drained is not None:
                self._drained.set()

    def _result(self) -> LevelResult:
        plan = self._plan
        start = self.started_ns
        window_start = int(plan.warmup_s * 1e9)
        window_end = window_start + int(plan.duration_s * 1e9)
        offsets = self._offsets
        scheduled = (offsets >= window_start) & (offsets < window_end)
        good = self._done_ns > 0
        ok = scheduled & good
        kinds = [kind for index, kind in self._error_of.items() if scheduled[index]]
        lost = scheduled & ~good & ~self._failed
        kinds += ["timeout"] * int(np.count_nonzero(lost))
        intended = start + offsets[ok]
        sent = self._sent_ns[ok]
        done = self._done_ns[ok]
        completed = good & (self._done_ns >= start + window_start)
        completed &= self._done_ns < start + window_end
        lag_ms = (sent - intended) / 1e6
        return LevelResult(
            mode="rate",
            level=self._rate,
            duration_s=plan.duration_s,
            ok=int(np.count_nonzero(ok)),
            errors=count_errors(kinds),
            throughput=int(np.count_nonzero(completed)) / plan.duration_s,
            latency=LatencySummary.from_ns(done - np.minimum(intended, sent)),
            batch_size=plan.batch_size,
            service_latency=LatencySummary.from_ns(done - sent),
            offered_rate=int(np.count_nonzero(scheduled)) / plan.duration_s,
            send_lag_p99_ms=float(np.percentile(lag_ms, 99)) if lag_ms.size else None,
            connections=self._channels.opened,
            error_samples=dict(self._errors.samples),
        )
