"""The idle path: unload models nobody calls, stop workers nobody needs, keep warm ones.

Every ``reaper_interval_s``, while this replica acts:

1. A model with ``min_replicas`` 0, no request in flight on any activator and none arriving
   for its ``idle_timeout_s`` loses all its replicas. Each is retired by the placer in the
   order that loses no request: placement removed, pause for activators, drain, unload.
   With ``sleep_after_s`` set (LLMs), after that long its replicas are put to sleep the same
   way instead (the engine stays, asleep, until a request wakes it), and sleeping replicas
   are unloaded once the model has been idle for ``idle_timeout_s``.
2. Replicas of models that are no longer registered are retired too, asleep or not.
3. In each pool (``settings.all_pools``), empty workers (no replica, load or unload)
   beyond its ``warm_workers`` are stopped once the pool has had more empty workers than
   that for ``pool_grace_period_s`` in a row, each of them empty that long too; the
   longest-empty ones go first, the most recently emptied stay warm (see
   :func:`decide_workers`).
4. While fewer than ``warm_workers`` workers of a pool are empty and it may grow, one more
   worker is started there, so the next cold start skips the worker start.
5. Workers in the store that this replica's backend does not run (another replica's local
   workers, left behind when it died) are probed; after ``worker_health_failures`` failed
   probes in a row they are removed with their placements, so requests stop going there.

Traffic reports expire in the store, so the reaper remembers the last activity it saw of
each model itself: a model whose reports lapsed is idle since its last request, not since
its placement.

A model registered with ``scaling.policy: adaptive`` is judged by its keep-alive plan
instead of ``idle_timeout_s`` alone (``control_plane.keepalive``): the reaper learns its idle
times from the traffic reports (kept in the store, so a failover forgets nothing), unloads it
when the plan no longer wants it loaded, and, while it is at zero, asks for a pre-warm (an
ordinary activation with trigger ``prewarm``, which never evicts another model) one load
time before the plan's pre-warm.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from control_plane import usage
from control_plane.backends.base import PodBackend
from control_plane.keepalive.history import IdleHistory
from control_plane.keepalive.plan import KeepAlivePlan, engine_state, wants_loaded
from control_plane.keepalive.policies import AdaptivePolicy, KeepAlivePolicy
from control_plane.keepalive.tracker import STATE_KEY, IdleTracker, track
from control_plane.metrics import ControlPlaneMetrics
from control_plane.settings import ControlPlaneSettings
from control_plane.store.base import StateStore
from control_plane.store.errors import StoreUnavailableError
from foundation.errors import ZeroserveError
from foundation.records import ModelRecord, Placement, TrafficReport, WorkerRecord

__all__ = [
    "Acting",
    "Activations",
    "Liveness",
    "PoolState",
    "Reaper",
    "ReplicaRetirer",
    "WorkerDecision",
    "decide_workers",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PoolState:
    """What :func:`decide_workers` remembers between sweeps."""

    empty_since: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """Worker id -> when it was first seen empty (it loses its entry once it holds work)."""
    surplus_since: float | None = None
    """Since when the pool has had more empty workers than ``warm_workers``; None: not now."""


@dataclass(frozen=True, slots=True)
class WorkerDecision:
    """What one sweep does with the pool's workers."""

    stop: tuple[str, ...] = ()
    """Empty workers to stop."""
    start: bool = False
    """Start one more (empty, warm) worker."""


def _decide(
    policy: KeepAlivePolicy,
    tracker: IdleTracker,
    record: ModelRecord,
    load_s: float,
    now: float,
) -> KeepAlivePlan:
    return policy.decide(
        tracker.history, bound_s=record.scaling.idle_timeout_s, load_s=load_s, now=now
    )


def decide_workers(
    idle: Sequence[str],
    *,
    workers: int,
    starting: int,
    warm_workers: int,
    max_workers: int,
    grace_s: float,
    state: PoolState,
    now: float,
) -> tuple[WorkerDecision, PoolState]:
    """Which empty workers to stop and whether to start a warm one, at monotonic ``now``.

    ``idle`` are the pool's empty workers, ``workers`` all its workers, ``starting`` the
    starts under way. A surplus of empty workers is only trimmed once it has lasted
    ``grace_s``: when a model takes the warm worker, a replacement starts at once, and when
    the model goes again there is one empty worker too many. Judged by each worker's own
    empty time, the replacement (empty since it started) would be stopped at once, and the
    model's next activation would start another, and so on; judged by how long the pool has
    had the surplus, a model that comes back within the grace period finds the pool as it
    left it, and nothing starts or stops.
    """
    empty_since = {w: state.empty_since.get(w, now) for w in idle}
    surplus = len(idle) - warm_workers
    surplus_since: float | None = None
    stop: tuple[str, ...] = ()
    if surplus > 0:
        surplus_since = state.surplus_since if state.surplus_since is not None else now
        if now - surplus_since >= grace_s:
            # The longest-empty go first; the most recently emptied stay warm.
            by_age = sorted(idle, key=lambda w: (empty_since[w], w))
            stop = tuple(w for w in by_age[:surplus] if now - empty_since[w] >= grace_s)
    start = len(idle) + starting < warm_workers and workers + starting < max_workers
    return (
        WorkerDecision(stop=stop, start=start),
        PoolState(empty_since=MappingProxyType(empty_since), surplus_since=surplus_since),
    )


class ReplicaRetirer(Protocol):
    """What the reaper needs of the placer."""

    async def retire(self, model: str, worker_id: str, *, reason: str) -> None: ...

    async def sleep(self, model: str, worker_id: str) -> None: ...

    async def unload_sleeping(self, model: str, worker_id: str) -> None: ...

    def is_idle(self, worker_id: str, placements: list[Placement]) -> bool: ...

    async def stop_worker_if_idle(self, worker_id: str) -> bool: ...

    async def start_worker(self, pool: str) -> WorkerRecord: ...


class Liveness(Protocol):
    """Probes a worker by URL (``WorkerClient.is_live``)."""

    async def is_live(self, url: str) -> bool: ...


class Activations(Protocol):
    """What the reaper needs of the orchestrator."""

    def is_activating(self, model: str) -> bool: ...

    def request(self, model: str, *, trigger: str = "request") -> None: ...


class Acting(Protocol):
    @property
    def is_acting(self) -> bool: ...


class Reaper:
    """Scale-to-zero of idle models and scale-down of idle workers.

    Parameters:
        clock: monotonic seconds (worker grace periods).
        wall: wall-clock seconds since the epoch (traffic reports carry wall-clock times).
    """

    def __init__(
        self,
        store: StateStore,
        placer: ReplicaRetirer,
        backend: PodBackend,
        activations: Activations,
        liveness: Liveness,
        settings: ControlPlaneSettings,
        metrics: ControlPlaneMetrics,
        acting: Acting,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._placer = placer
        self._backend = backend
        self._activations = activations
        self._liveness = liveness
        self._settings = settings
        self._metrics = metrics
        self._acting = acting
        self._clock = clock
        self._wall = wall
        self._last_active: dict[str, float] = {}
        """model -> wall-clock time it was last seen with a request."""
        self._pools: dict[str, PoolState] = {}
        """Pool name -> what its worker decisions remember between sweeps."""
        self._foreign_failures: dict[str, int] = {}
        """worker id -> failed probes in a row, for workers our backend does not run."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        """Retirements and worker starts under way, by a key that de-duplicates them."""
        self._trackers: dict[str, IdleTracker] = {}
        """Adaptive models -> what they taught about their idle times (read from the store
        once, written back when it changes)."""
        self._load_s: dict[str, float] = {}
        """Adaptive models -> their last measured load time (from activation timelines)."""
        self._plans: dict[str, tuple[IdleHistory, tuple[float, float, bool], KeepAlivePlan]] = {}
        """Adaptive models -> their plan, with the history and (load time, bound, whether
        the history is trusted) it was decided on."""
        self._ledgers: dict[str, usage.UsageLedger] = {}
        """Models -> their usage (read from the store once, written back every few s)."""
        self._unflushed: dict[str, float] = {}
        """Models whose ledger changed -> when it was last written to the store."""
        self._busy: dict[str, bool] = {}
        """Models -> whether the last sweep saw requests in flight."""

    async def run(self) -> None:
        """Sweep every ``reaper_interval_s`` while acting; runs until cancelled."""
        is_failing = False
        while True:
            await asyncio.sleep(self._settings.reaper_interval_s)
            if not self._acting.is_acting:
                continue
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except StoreUnavailableError as exc:
                # Once per outage: the sweep runs several times a second.
                if not is_failing:
                    logger.warning("reaper paused: %s", exc)
                is_failing = True
            except Exception:
                logger.exception("reaper sweep failed; retrying next interval")
            else:
                if is_failing:
                    logger.info("reaper resumed: the state store answers again")
                is_failing = False

    async def sweep(self) -> None:
        """One pass over models and workers; retirements and starts run in the background."""
        placements = await self._store.list_placements()
        sleeping = await self._store.list_sleeping()
        models = {m.name: m for m in await self._store.list_models()}
        await self._reap_models(placements, sleeping, models)
        for gone in set(self._ledgers) - set(models):
            del self._ledgers[gone]
            self._unflushed.pop(gone, None)
            self._busy.pop(gone, None)
        await self.flush_usage()
        await self._reap_workers(
            await self._store.list_placements() + await self._store.list_sleeping()
        )
        await self._reap_foreign_workers()

    async def _reap_models(
        self,
        placements: list[Placement],
        sleeping: list[Placement],
        models: dict[str, ModelRecord],
    ) -> None:
        by_model: dict[str, list[Placement]] = {}
        for placement in placements:
            by_model.setdefault(placement.model, []).append(placement)
        asleep: dict[str, list[Placement]] = {}
        for sleeper in sleeping:
            asleep.setdefault(sleeper.model, []).append(sleeper)
        now = self._wall()
        for name in list(self._last_active):
            if name not in by_model and name not in asleep:
                del self._last_active[name]
        await self._reap_sleeping(asleep, models, now)
        await self._prewarm(by_model, asleep, models, now)
        for name, replicas in by_model.items():
            record = models.get(name)
            if record is None:
                for p in replicas:
                    self._retire(p, reason="deleted")
                continue
            reports = await self._store.traffic(name)
            learned = None
            if record.scaling.policy == "adaptive":
                # Before the checks below: a busy model's requests end its idle periods.
                learned = await self._plan(record, reports, now)
            in_flight = sum(r.in_flight for r in reports)
            await self._account(name, replicas, is_busy=in_flight > 0, now=now)
            last = max([r.last_request_at for r in reports] + [p.since for p in replicas])
            if in_flight > 0:
                last = now
            last = max(last, self._last_active.get(name, 0.0))
            self._last_active[name] = last
            if record.scaling.min_replicas > 0 or in_flight > 0:
                continue
            if self._activations.is_activating(name):
                continue
            idle_s = now - last
            if learned is not None:
                tracker, plan, load_s = learned
                if tracker.idle_since is not None:
                    # A pre-warmed replica waits for the plan's window, counted from the
                    # last request; any other (a cold start, an admin load) from its
                    # placement too, so a fresh load is not undone at once.
                    since = tracker.idle_since
                    if tracker.prewarmed_for != since:
                        since = max(since, min(p.since for p in replicas))
                    idle_s = now - since
                state = engine_state(
                    plan, idle_s, load_s, sleep_after_s=record.scaling.sleep_after_s
                )
                if state == "sleeping":
                    logger.info(
                        "%s idle for %.1f s; putting it to sleep (%s)",
                        name,
                        idle_s,
                        plan.reason,
                        extra={"model": name},
                    )
                    for p in replicas:
                        self._sleep(p)
                    continue
                if state == "loaded":
                    continue
                logger.info(
                    "%s idle for %.1f s; unloading (%s)",
                    name,
                    idle_s,
                    plan.reason,
                    extra={"model": name},
                )
                for p in replicas:
                    self._retire(p, reason="idle")
                continue
            sleep_after_s = record.scaling.sleep_after_s
            if 0 < sleep_after_s <= idle_s < record.scaling.idle_timeout_s:
                logger.info(
                    "%s idle for %.1f s (sleep after %.1f s); putting it to sleep",
                    name,
                    idle_s,
                    sleep_after_s,
                    extra={"model": name},
                )
                for p in replicas:
                    self._sleep(p)
                continue
            if idle_s < record.scaling.idle_timeout_s:
                continue
            logger.info(
                "%s idle for %.1f s (timeout %.1f s); scaling to zero",
                name,
                now - last,
                record.scaling.idle_timeout_s,
                extra={"model": name},
            )
            for p in replicas:
                self._retire(p, reason="idle")

    async def _reap_sleeping(
        self, asleep: dict[str, list[Placement]], models: dict[str, ModelRecord], now: float
    ) -> None:
        """Unload sleeping replicas of deleted models, and of models idle past their
        ``idle_timeout_s`` (counted from the last request, as for loaded replicas)."""
        for name, sleepers in asleep.items():
            record = models.get(name)
            if record is None:
                for s in sleepers:
                    self._unload_sleeping(s, reason="deleted")
                continue
            reports = await self._store.traffic(name)
            if sum(r.in_flight for r in reports) > 0 or self._activations.is_activating(name):
                continue
            # A replica fell asleep sleep_after_s after the last request, unless the reaper
            # that saw that request is gone (a failover): then count from the sleep.
            fallback = min(s.since for s in sleepers) - record.scaling.sleep_after_s
            last = max(
                [r.last_request_at for r in reports] + [self._last_active.get(name, fallback)]
            )
            self._last_active[name] = last
            if now - last < record.scaling.idle_timeout_s:
                continue
            logger.info(
                "%s idle for %.1f s (timeout %.1f s); unloading its sleeping replicas",
                name,
                now - last,
                record.scaling.idle_timeout_s,
                extra={"model": name},
            )
            for s in sleepers:
                self._unload_sleeping(s, reason="idle")

    async def _account(
        self, name: str, replicas: list[Placement], *, is_busy: bool, now: float
    ) -> None:
        """Add the time since the last sweep to the model's usage (serving or idle per
        loaded replica), and the activations finished since."""
        ledger = self._ledgers.get(name)
        if ledger is None:
            doc = await self._store.get_model_state(name, usage.STATE_KEY)
            ledger = usage.UsageLedger.from_json(doc) if doc else usage.UsageLedger()
        since = ledger.accounted_at
        if since is None or any(p.since > since for p in replicas):
            ledger, added = usage.fold_activations(ledger, await self._store.list_activations(name))
            for one in added:
                self._metrics.replica_seconds.labels(name, "loading").inc(one.loading_s)
                if one.cold_starts:
                    self._metrics.cold_starts.labels(name).inc(one.cold_starts)
                    self._metrics.cold_start_wait.labels(name).inc(one.cold_start_wait_s)
        held = sum(
            max(0.0, now - max(p.since, since if since is not None else p.since)) for p in replicas
        )
        # The time since the last sweep is counted in the state that sweep saw.
        was_busy = self._busy.get(name, is_busy)
        self._busy[name] = is_busy
        state = "serving" if was_busy else "idle"
        if held > 0:
            amount = usage.Usage(serving_s=held) if was_busy else usage.Usage(idle_s=held)
            start = since if since is not None else min(p.since for p in replicas)
            ledger = usage.add(ledger, amount, start=min(start, now), end=now)
            self._metrics.replica_seconds.labels(name, state).inc(held)
        self._ledgers[name] = usage.UsageLedger(
            buckets=ledger.buckets, counted=ledger.counted, accounted_at=now
        )
        self._unflushed.setdefault(name, now)

    async def flush_usage(self, *, force: bool = False) -> None:
        """Write changed ledgers to the store: those unwritten for ``usage_flush_s``, or
        all of them with ``force``."""
        now = self._wall()
        for name, since in list(self._unflushed.items()):
            if not force and now - since < self._settings.usage_flush_s:
                continue
            ledger = self._ledgers.get(name)
            if ledger is not None:
                await self._store.put_model_state(name, usage.STATE_KEY, ledger.to_json())
            del self._unflushed[name]

    async def _prewarm(
        self,
        by_model: dict[str, list[Placement]],
        asleep: dict[str, list[Placement]],
        models: dict[str, ModelRecord],
        now: float,
    ) -> None:
        """Learn the idle times of adaptive models at zero and pre-warm them on plan."""
        for gone in set(self._trackers) - set(models):
            del self._trackers[gone]
            self._load_s.pop(gone, None)
            self._plans.pop(gone, None)
        for name, record in models.items():
            if record.scaling.policy != "adaptive" or record.scaling.min_replicas > 0:
                continue
            if name in by_model or name in asleep or self._activations.is_activating(name):
                continue
            reports = await self._store.traffic(name)
            if any(r.in_flight > 0 for r in reports):
                continue  # the activator is bringing it up for those requests
            tracker, plan, load_s = await self._plan(record, reports, now)
            since = tracker.idle_since
            if since is None or plan.prewarm_at_s is None or tracker.prewarmed_for == since:
                continue
            idle_s = now - since
            if idle_s < plan.keep_alive_s or not wants_loaded(plan, idle_s, load_s):
                continue
            logger.info(
                "pre-warming %s: idle %.1f s, predicted next request at %.1f s (%s)",
                name,
                idle_s,
                plan.prewarm_at_s,
                plan.reason,
                extra={"model": name},
            )
            self._trackers[name] = tracker = IdleTracker(
                history=tracker.history, idle_since=since, prewarmed_for=since
            )
            await self._store.put_model_state(name, STATE_KEY, tracker.to_json())
            self._activations.request(name, trigger="prewarm")

    async def _plan(
        self, record: ModelRecord, reports: Sequence[TrafficReport], now: float
    ) -> tuple[IdleTracker, KeepAlivePlan, float]:
        """The model's tracker updated from ``reports``, its plan, and its load time."""
        name = record.name
        policy = AdaptivePolicy(min_gaps=self._settings.keepalive_min_idle_times)
        tracker = self._trackers.get(name)
        if tracker is None:
            doc = await self._store.get_model_state(name, STATE_KEY)
            tracker = IdleTracker.from_json(doc) if doc else IdleTracker(policy.new_history())
        last = max((r.last_request_at for r in reports), default=None)
        began = tracker.idle_since
        tracker, learned = track(
            tracker, last_request_at=last, in_flight=sum(r.in_flight for r in reports), now=now
        )
        self._trackers[name] = tracker
        # Also when an idle period begins: the reports that show it expire, and a reaper
        # taking over later must still know when it began to learn it and pre-warm in it.
        if learned or tracker.idle_since not in (None, began):
            await self._store.put_model_state(name, STATE_KEY, tracker.to_json())
        if learned or name not in self._load_s:
            self._load_s[name] = await self._measured_load_s(name)
        load_s = self._load_s[name]
        # Decay scales every count of the history alike and the plan reads only their
        # shape, so it changes with a new idle time, the load time or the bound, or when
        # decay takes the history below the policy's minimum: otherwise the last plan
        # stands (deciding costs ~0.1 ms, every sweep, on the loop that may serve requests).
        inputs = (
            load_s,
            record.scaling.idle_timeout_s,
            tracker.history.decayed_to(now).gaps >= policy.min_gaps,
        )
        cached = self._plans.get(name)
        if cached is not None and cached[0] is tracker.history and cached[1] == inputs:
            return tracker, cached[2], load_s
        plan = _decide(policy, tracker, record, load_s, now)
        self._plans[name] = (tracker.history, inputs, plan)
        return tracker, plan, load_s

    async def _measured_load_s(self, model: str) -> float:
        """The newest successful activation's time to ready, else the configured default."""
        for timeline in await self._store.list_activations(model):
            total = timeline.get("durations_s", {}).get("total")
            if timeline.get("outcome") == "ready" and isinstance(total, (int, float)):
                return float(total)
        return self._settings.keepalive_default_load_s

    async def _reap_workers(self, placements: list[Placement]) -> None:
        count = 0
        for pool in self._settings.all_pools:
            workers = self._backend.list_workers(pool.name)
            count += len(workers)
            starts = f"start:{pool.name}:"
            decision, self._pools[pool.name] = decide_workers(
                [w.id for w in workers if self._placer.is_idle(w.id, placements)],
                workers=len(workers),
                starting=sum(1 for key in self._tasks if key.startswith(starts)),
                warm_workers=pool.warm_workers,
                max_workers=pool.max_workers,
                grace_s=self._settings.pool_grace_period_s,
                state=self._pools.get(pool.name, PoolState()),
                now=self._clock(),
            )
            for worker_id in decision.stop:
                self._stop(worker_id)
            if decision.start:
                self._run(f"{starts}{len(workers)}", self._start_warm(pool.name))
        self._metrics.workers.set(count)

    async def _reap_foreign_workers(self) -> None:
        ours = {w.id for w in self._backend.list_workers()}
        foreign = [w for w in await self._store.list_workers() if w.id not in ours]
        for worker_id in set(self._foreign_failures) - {w.id for w in foreign}:
            del self._foreign_failures[worker_id]
        if not foreign:
            return
        results = await asyncio.gather(*(self._liveness.is_live(w.url) for w in foreign))
        for worker, is_live in zip(foreign, results, strict=True):
            if is_live:
                self._foreign_failures.pop(worker.id, None)
                continue
            failures = self._foreign_failures.get(worker.id, 0) + 1
            self._foreign_failures[worker.id] = failures
            if failures >= self._settings.worker_health_failures:
                logger.warning(
                    "worker %s (not ours) failed %d probes; removing it and its placements",
                    worker.id,
                    failures,
                    extra={"worker": worker.id},
                )
                await self._store.remove_worker(worker.id)
                del self._foreign_failures[worker.id]
                self._metrics.worker_stops.labels("lost").inc()

    def _retire(self, placement: Placement, *, reason: str) -> None:
        key = f"retire:{placement.model}:{placement.worker_id}"
        self._run(key, self._retire_one(placement, reason))

    async def _retire_one(self, placement: Placement, reason: str) -> None:
        await self._placer.retire(placement.model, placement.worker_id, reason=reason)
        self._metrics.unloads.labels(reason).inc()

    def _sleep(self, placement: Placement) -> None:
        # Keyed like a retirement: a replica is either put to sleep or unloaded, not both.
        key = f"retire:{placement.model}:{placement.worker_id}"
        self._run(key, self._placer.sleep(placement.model, placement.worker_id))

    def _unload_sleeping(self, sleeper: Placement, *, reason: str) -> None:
        key = f"unload-sleeping:{sleeper.model}:{sleeper.worker_id}"
        self._run(key, self._unload_sleeping_one(sleeper, reason))

    async def _unload_sleeping_one(self, sleeper: Placement, reason: str) -> None:
        await self._placer.unload_sleeping(sleeper.model, sleeper.worker_id)
        self._metrics.unloads.labels(reason).inc()

    def _stop(self, worker_id: str) -> None:
        self._run(f"stop:{worker_id}", self._stop_one(worker_id))

    async def _stop_one(self, worker_id: str) -> None:
        if await self._placer.stop_worker_if_idle(worker_id):
            self._metrics.worker_stops.labels("idle").inc()
            logger.info("stopped idle worker %s", worker_id, extra={"worker": worker_id})

    async def _start_warm(self, pool: str) -> None:
        worker = await self._placer.start_worker(pool)
        self._metrics.worker_starts.inc()
        logger.info("started warm worker %s", worker.id, extra={"worker": worker.id})

    def _run(self, key: str, work: Coroutine[Any, Any, None]) -> None:
        if key in self._tasks:
            work.close()
            return
        task = asyncio.create_task(self._guard(key, work), name=f"reaper-{key}")
        self._tasks[key] = task

    async def _guard(self, key: str, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except ZeroserveError as exc:
            logger.warning("reaper %s failed: %s", key, exc.message)
        except Exception:
            logger.exception("reaper %s failed", key)
        finally:
            self._tasks.pop(key, None)

    async def settle(self) -> None:
        """Wait for the retirements, stops and starts under way to finish."""
        while self._tasks:
            await asyncio.wait(list(self._tasks.values()))

    async def close(self) -> None:
        try:
            await self.flush_usage(force=True)
        except ZeroserveError as exc:
            logger.warning("usage not written at shutdown: %s", exc.message)
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
