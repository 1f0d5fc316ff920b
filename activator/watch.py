"""Watching the workers behind the routing table: stalls, probes, suspensions.

:class:`ReplicaWatch` ticks a few times a second. Each tick it sums, per worker, what the
proxy records on the replicas (requests waiting for a head, the last head's time), asks
:func:`activator.health.decide_probe` whether the worker needs a liveness probe, and
starts the probes that do, one at a time per worker. A probe's verdict
(:func:`activator.health.after_probe`) suspends the worker in the
:class:`~activator.placements.PlacementView` (its replicas leave the table, so requests
not yet sent go to other replicas or wait in the buffer, which asks for an activation when
no replica is left) or resumes it. Requests already sent to a suspended worker keep waiting
for it: they may have been read, so sending them elsewhere could run them twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol
from urllib.parse import urlsplit

from activator.health import (
    StallPolicy,
    Verdict,
    WorkerHealth,
    WorkerSignals,
    after_probe,
    decide_probe,
)
from activator.placements import ReplicaTable

logger = logging.getLogger(__name__)

_LIVE_PATH = b"/v2/health/live"


class LivenessProbe(Protocol):
    """Whether the worker at ``url`` answers its liveness endpoint within ``timeout_s``."""

    async def __call__(self, url: str, timeout_s: float) -> bool: ...


class Suspender(Protocol):
    """Takes a worker's replicas out of routing and puts them back (``PlacementView``)."""

    def suspend(self, worker_id: str) -> list[str]: ...

    def resume(self, worker_id: str) -> None: ...

    def suspended(self) -> dict[str, str]: ...


class SuspensionObserver(Protocol):
    """Told of the models whose replica a suspension took out (the activator's metrics)."""

    def replicas_suspended(self, models: Iterable[str]) -> None: ...


async def probe_live(url: str, timeout_s: float) -> bool:
    """``GET /v2/health/live`` on a connection of its own: True on a 200 within
    ``timeout_s``. Not through the upstream pool, whose connections may be the ones stuck."""
    parts = urlsplit(url)
    if not parts.hostname:
        return False
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
            authority = parts.netloc.encode("latin-1")
            writer.write(
                b"GET " + _LIVE_PATH + b" HTTP/1.1\r\nhost: " + authority + b"\r\n"
                b"connection: close\r\n\r\n"
            )
            status_line = await reader.readline()
    except (OSError, TimeoutError):
        return False
    finally:
        if writer is not None:
            writer.close()
    fields = status_line.split(None, 2)
    return len(fields) >= 2 and fields[1] == b"200"


class ReplicaWatch:
    """Probes stalled and suspended workers and suspends or resumes them.

    Parameters:
        table: the routed replicas, with the proxy's head-wait records.
        view: suspends and resumes workers.
        probe: one liveness probe.
        policy: when to probe.
        probe_timeout_s: a probe slower than this fails.
        tick_s: time between two looks at the table.
        observer: told of every suspension.
        clock: event-loop seconds, the base of the replicas' records.
    """

    def __init__(
        self,
        table: ReplicaTable,
        view: Suspender,
        probe: LivenessProbe,
        policy: StallPolicy,
        *,
        probe_timeout_s: float,
        tick_s: float,
        observer: SuspensionObserver | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._table = table
        self._view = view
        self._probe = probe
        self._policy = policy
        self._probe_timeout_s = probe_timeout_s
        self._tick_s = tick_s
        self._observer = observer
        self._clock = clock
        self._health: dict[str, WorkerHealth] = {}
        self._probes: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        """Tick until cancelled."""
        clock = self._clock or asyncio.get_running_loop().time
        while True:
            self.tick(clock())
            await asyncio.sleep(self._tick_s)

    def tick(self, now: float) -> None:
        """Start the probes due at ``now``."""
        signals, urls = self._signals()
        suspended = self._view.suspended()
        urls.update(suspended)
        # Forget workers neither routed nor suspended: gone from the store.
        for worker_id in [w for w in self._health if w not in urls]:
            del self._health[worker_id]
        for worker_id, url in urls.items():
            if worker_id in self._probes:
                continue
            health = self._health.get(worker_id, WorkerHealth())
            is_due, health = decide_probe(signals.get(worker_id), health, self._policy, now)
            self._health[worker_id] = health
            if is_due:
                task = asyncio.create_task(
                    self._probe_once(worker_id, url), name=f"activator-probe-{worker_id}"
                )
                self._probes[worker_id] = task

    async def close(self) -> None:
        """Cancel the probes under way."""
        for task in self._probes.values():
            task.cancel()
        await asyncio.gather(*self._probes.values(), return_exceptions=True)
        self._probes.clear()

    def _signals(self) -> tuple[dict[str, WorkerSignals], dict[str, str]]:
        """Per routed worker: its replicas' head waits summed up, and its URL."""
        signals: dict[str, WorkerSignals] = {}
        urls: dict[str, str] = {}
        for model in self._table.models():
            for replica in self._table.replicas(model):
                urls[replica.worker_id] = replica.url
                seen = signals.get(replica.worker_id)
                if seen is None:
                    signals[replica.worker_id] = WorkerSignals(
                        replica.awaiting_head, replica.progress_at
                    )
                else:
                    # One head from the worker, for any model, shows it is running.
                    signals[replica.worker_id] = WorkerSignals(
                        seen.awaiting_head + replica.awaiting_head,
                        max(seen.progress_at, replica.progress_at),
                    )
        return signals, urls

    async def _probe_once(self, worker_id: str, url: str) -> None:
        try:
            is_live = await self._probe(url, self._probe_timeout_s)
            health = self._health.get(worker_id)
            if health is None:
                return  # gone from the store meanwhile
            verdict, self._health[worker_id] = after_probe(health, is_live=is_live)
            if verdict is Verdict.SUSPEND:
                models = self._view.suspend(worker_id)
                if self._observer is not None and models:
                    self._observer.replicas_suspended(models)
            elif verdict is Verdict.RESUME:
                self._view.resume(worker_id)
        except Exception:
            # A bug here must not stop the watch; the worker is probed again next time.
            logger.exception("probing worker %s failed", worker_id)
        finally:
            self._probes.pop(worker_id, None)
