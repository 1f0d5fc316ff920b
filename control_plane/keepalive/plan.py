"""What a keep-alive policy decides for one model's idle period, and what that costs.

A plan is read from the moment the model went idle (its last request finished): keep the
replica loaded for ``keep_alive_s``; then, when ``prewarm_at_s`` is set, have it loaded
again (a pre-warm) by that idle time and keep it until ``prewarm_at_s + prewarm_window_s``.
:func:`wants_loaded` is the plan as the reaper applies it, :func:`outcome` what it costs on
idle gaps whose length is known (the simulator and the oracle).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "EngineState",
    "KeepAlivePlan",
    "Outcome",
    "engine_state",
    "oracle_outcome",
    "outcome",
    "wants_loaded",
]

EngineState = Literal["loaded", "sleeping", "unloaded"]


@dataclass(frozen=True, slots=True)
class KeepAlivePlan:
    """Keep-alive and pre-warm for one idle period, in seconds since the model went idle."""

    keep_alive_s: float
    """Unload this long after the last request finished (``math.inf``: never)."""
    prewarm_at_s: float | None = None
    """Be loaded again this long after going idle (loading starts a load time earlier);
    None: no pre-warm."""
    prewarm_window_s: float = 0.0
    """After a pre-warm, unload again if no request came this long after ``prewarm_at_s``."""
    reason: str = ""
    """Why: the policy and the branch it took, for logs and the admin API."""

    @property
    def loaded_until_s(self) -> float:
        """The idle time after which the plan never wants the model loaded again."""
        if self.prewarm_at_s is None:
            return self.keep_alive_s
        return max(self.keep_alive_s, self.prewarm_at_s + self.prewarm_window_s)


def wants_loaded(plan: KeepAlivePlan, idle_s: float, load_s: float) -> bool:
    """Whether ``plan`` wants the model loaded (or loading) ``idle_s`` into its idle period,
    for a model that takes ``load_s`` to load: before the keep-alive runs out, and from one
    load time before the pre-warm until its window closes."""
    if idle_s < plan.keep_alive_s:
        return True
    if plan.prewarm_at_s is None:
        return False
    return plan.prewarm_at_s - load_s <= idle_s < plan.prewarm_at_s + plan.prewarm_window_s


def engine_state(
    plan: KeepAlivePlan, idle_s: float, load_s: float, *, sleep_after_s: float
) -> EngineState:
    """Where a loaded replica should be ``idle_s`` into its idle period under ``plan``.

    An engine that can sleep (``sleep_after_s`` > 0: an LLM engine that frees the device
    and keeps its weights in host memory, woken in a fraction of a load) sleeps where the
    plan would unload it, or at ``sleep_after_s`` if that comes first; ``idle_timeout_s``
    later unloads it asleep (the reaper's sleeping path, the same for every policy). Any
    other replica stays loaded while the plan wants it and is unloaded after."""
    is_wanted = wants_loaded(plan, idle_s, load_s)
    if sleep_after_s > 0 and (idle_s >= sleep_after_s or not is_wanted):
        return "sleeping"
    return "loaded" if is_wanted else "unloaded"


@dataclass(frozen=True, slots=True)
class Outcome:
    """Per idle gap: whether the next request waited, how long, and the GPU time spent."""

    cold: NDArray[np.bool_]
    """The request ending the gap found no loaded replica (it waited for a load)."""
    added_latency_s: NDArray[np.float64]
    """How long it waited (0 when warm)."""
    idle_s: NDArray[np.float64]
    """Replica-seconds held loaded without a request during the gap."""
    loading_s: NDArray[np.float64]
    """Replica-seconds spent loading (pre-warms and cold starts) for the gap."""


def outcome(
    gap_s: ArrayLike,
    *,
    keep_alive_s: ArrayLike,
    prewarm_at_s: ArrayLike,
    prewarm_window_s: ArrayLike,
    load_s: float,
) -> Outcome:
    """What plans cost on idle gaps of known length (arrays broadcast together).

    ``prewarm_at_s`` is NaN where a plan has no pre-warm. A pre-warm whose load would start
    before the keep-alive ends merges with it: the replica simply stays loaded until the
    pre-warm window closes. A request arriving while a pre-warm loads waits for the rest.
    """
    gap = np.asarray(gap_s, dtype=np.float64)
    keep, ready, window = np.broadcast_arrays(
        np.asarray(keep_alive_s, dtype=np.float64),
        np.asarray(prewarm_at_s, dtype=np.float64),
        np.asarray(prewarm_window_s, dtype=np.float64),
    )
    gap, keep, ready, window = np.broadcast_arrays(gap, keep, ready, window)
    has_prewarm = ~np.isnan(ready)
    ready = np.where(has_prewarm, ready, np.inf)
    window = np.where(has_prewarm, window, 0.0)
    start = ready - load_s
    merged = has_prewarm & (start <= keep)
    keep = np.where(merged, np.maximum(keep, ready + window), keep)
    separate = has_prewarm & ~merged
    end = ready + window

    warm_keep = gap <= keep
    before = separate & (gap > keep) & (gap < start)
    during = separate & (gap >= start) & (gap < ready)
    inside = separate & (gap >= ready) & (gap <= end)
    after = separate & (gap > end)
    plain_cold = ~has_prewarm & ~warm_keep | merged & ~warm_keep

    cold = plain_cold | before | during | after
    cold &= ~warm_keep
    latency = np.where(plain_cold | before | after, load_s, np.where(during, ready - gap, 0.0))
    latency = np.where(warm_keep, 0.0, latency)
    since_ready = np.where(inside, gap - np.where(inside, ready, 0.0), 0.0)
    idle = np.where(
        warm_keep, gap, np.where(inside, keep + since_ready, np.where(after, keep + window, keep))
    )
    loads = np.where(warm_keep, 0.0, np.where(after, 2.0, 1.0))
    return Outcome(
        cold=cold,
        added_latency_s=np.asarray(latency, dtype=np.float64),
        idle_s=np.asarray(np.where(np.isinf(idle), gap, idle), dtype=np.float64),
        loading_s=np.asarray(loads * load_s, dtype=np.float64),
    )


def oracle_outcome(gap_s: ArrayLike, *, load_s: float) -> Outcome:
    """The offline oracle, which knows each gap: it keeps the replica through a gap shorter
    than a load and otherwise unloads at once and reloads to be ready exactly on time. No
    cold start, and the least GPU time any plan can spend on the gap (``min(gap, load)``)."""
    gap = np.asarray(gap_s, dtype=np.float64)
    keep = gap <= load_s
    return Outcome(
        cold=np.zeros(gap.shape, dtype=np.bool_),
        added_latency_s=np.zeros(gap.shape),
        idle_s=np.where(keep, gap, 0.0),
        loading_s=np.where(keep, 0.0, load_s),
    )
