"""The autoscaler loop: the only code that ticks, gathers traffic and applies decisions.

Every ``autoscaler_tick_s``, while this replica acts, for each registered model: sum the
activators' traffic reports, count ready replicas (placements) and pending ones (activations
under way), ask ``policy.decide`` and apply the answer. More replicas are activations started
through the orchestrator; fewer are retirements through the placer, newest replica first. A
decision of 0 is applied as 1: the last replica is the reaper's, after ``idle_timeout_s``
(see ``policy``). Activators do not report buffered requests separately; with no replica
ready every request in flight is a buffered one, which is what the fast path needs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from control_plane.autoscaler.policy import (
    AutoscalerSettings,
    PolicyState,
    ScalingContext,
    decide,
    initial_state,
)
from control_plane.metrics import ControlPlaneMetrics
from control_plane.store.base import StateStore
from control_plane.store.errors import StoreUnavailableError
from foundation.records import ModelRecord, Placement

__all__ = ["Acting", "AutoscalerLoop", "ReplicaRetirer", "ReplicaStarter"]

logger = logging.getLogger(__name__)


class ReplicaStarter(Protocol):
    """What the loop needs of the orchestrator."""

    def pending(self, model: str) -> int: ...

    def add_replicas(self, model: str, count: int, *, trigger: str = ...) -> None: ...


class ReplicaRetirer(Protocol):
    """What the loop needs of the placer."""

    def retire_soon(self, model: str, worker_id: str, *, reason: str) -> None: ...


class Acting(Protocol):
    @property
    def is_acting(self) -> bool: ...


class AutoscalerLoop:
    """Replicas per model from observed concurrency (KPA), applied every tick.

    Parameters:
        policy: the decision's tuning (windows, panic threshold, rates).
        tick_s: period of the loop.
        clock: monotonic seconds, the ``now`` each decision gets.
    """

    def __init__(
        self,
        store: StateStore,
        starter: ReplicaStarter,
        retirer: ReplicaRetirer,
        policy: AutoscalerSettings,
        metrics: ControlPlaneMetrics,
        acting: Acting,
        *,
        tick_s: float,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._starter = starter
        self._retirer = retirer
        self._policy = policy
        self._metrics = metrics
        self._acting = acting
        self._tick_s = tick_s
        self._retry_s = retry_s
        self._clock = clock
        self._states: dict[str, PolicyState] = {}

    async def run(self) -> None:
        """Tick until cancelled; a tick that fails is logged and the next one tries again."""
        was_acting = False
        is_failing = False
        while True:
            await asyncio.sleep(self._tick_s)
            is_acting = self._acting.is_acting
            if not is_acting:
                if was_acting:
                    # Another replica acts now; its windows are its own. Start afresh if
                    # the lease comes back.
                    self._states.clear()
                was_acting = False
                continue
            was_acting = True
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except StoreUnavailableError as exc:
                if not is_failing:
                    logger.warning("autoscaler paused: %s", exc)
                is_failing = True
                await asyncio.sleep(self._retry_s)
            except Exception:
                logger.exception("autoscaler tick failed; retrying in %.1f s", self._retry_s)
                await asyncio.sleep(self._retry_s)
            else:
                if is_failing:
                    logger.info("autoscaler resumed: the state store answers again")
                is_failing = False

    async def tick(self) -> None:
        """One decision for every registered model, applied."""
        now = self._clock()
        models = await self._store.list_models()
        placements = await self._store.list_placements()
        for name in set(self._states) - {m.name for m in models}:
            del self._states[name]
            self._metrics.desired_replicas.remove(name)
            self._metrics.replicas.remove(name)
        for model in models:
            ready = [p for p in placements if p.model == model.name]
            await self._scale(model, ready, now)

    async def _scale(self, model: ModelRecord, ready: list[Placement], now: float) -> None:
        reports = await self._store.traffic(model.name)
        in_flight = sum(max(r.in_flight, 0) for r in reports)
        pending = self._starter.pending(model.name)
        try:
            ctx = ScalingContext(
                spec=model.scaling,
                observed_concurrency=float(in_flight),
                ready_replicas=len(ready),
                pending_replicas=pending,
                buffered_requests=in_flight if not ready else 0,
            )
        except ValueError as exc:
            logger.warning("not scaling %s: %s", model.name, exc, extra={"model": model.name})
            return
        state = self._states.get(model.name) or initial_state(self._policy)
        decision, self._states[model.name] = decide(ctx, state, now, self._policy)
        want = decision.desired_replicas
        self._metrics.desired_replicas.labels(model.name).set(want)
        self._metrics.replicas.labels(model.name).set(len(ready))
        allocated = len(ready) + pending
        if want > allocated:
            logger.info(
                "scaling %s up: %d ready, %d pending, want %d (%s)",
                model.name,
                len(ready),
                pending,
                want,
                decision.reason,
                extra={"model": model.name},
            )
            self._starter.add_replicas(model.name, want - allocated, trigger="autoscaler")
        elif pending == 0 and len(ready) > max(want, 1):
            surplus = sorted(ready, key=lambda p: p.since, reverse=True)[
                : len(ready) - max(want, 1)
            ]
            logger.info(
                "scaling %s down: %d ready, want %d (%s)",
                model.name,
                len(ready),
                want,
                decision.reason,
                extra={"model": model.name},
            )
            for placement in surplus:
                self._retirer.retire_soon(model.name, placement.worker_id, reason="scale_down")
