"""When to doubt a worker, and what a liveness probe's answer means for its replicas.

The control plane's probes take seconds to condemn a worker (it kills what it condemns, so
it waits for several failures), and meanwhile the activator would keep sending it requests.
The activator watches its own traffic instead: a worker with requests waiting for their
answer's head and no head from it for ``stall_after_s`` gets one liveness probe of its own.
A probe that fails takes the worker's replicas out of this activator's routing (suspended)
until a later probe succeeds. A slow but live worker answers the probe and keeps its
requests; a stopped one gets no new ones within seconds.

Pure: no I/O, no clock of its own; :mod:`activator.watch` ticks, probes and applies.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

__all__ = ["StallPolicy", "Verdict", "WorkerHealth", "WorkerSignals", "after_probe", "decide_probe"]


@dataclass(frozen=True, slots=True)
class StallPolicy:
    """When a worker gets a liveness probe."""

    stall_after_s: float
    """Requests waiting for a head and none from the worker for this long: probe it."""
    probe_interval_s: float
    """Least time between two probes of one worker (while stalled, or while suspended)."""


@dataclass(frozen=True, slots=True)
class WorkerSignals:
    """What this activator's traffic says about one worker right now."""

    awaiting_head: int
    """Requests sent to it whose answer's head has not arrived."""
    progress_at: float
    """When it last sent a head, or when it was last given work with none pending."""


@dataclass(frozen=True, slots=True)
class WorkerHealth:
    """One worker's state in this activator."""

    is_suspended: bool = False
    """Out of routing: its last probe failed."""
    last_probe_at: float | None = None
    """When its last probe started."""


class Verdict(enum.Enum):
    """What a probe's answer changes."""

    NONE = "none"
    SUSPEND = "suspend"
    """Take the worker's replicas out of routing."""
    RESUME = "resume"
    """Put them back."""


def decide_probe(
    signals: WorkerSignals | None, health: WorkerHealth, policy: StallPolicy, now: float
) -> tuple[bool, WorkerHealth]:
    """Whether to probe the worker now, and its state if so (the probe counted as started).

    ``signals`` is None for a worker with no replica in routing (a suspended one): it is
    probed every ``probe_interval_s`` until it answers. A routed worker is probed only when
    stalled: requests wait on it and it has sent no head for ``stall_after_s``.
    """
    if health.last_probe_at is not None and now - health.last_probe_at < policy.probe_interval_s:
        return False, health
    if not health.is_suspended:
        if signals is None or signals.awaiting_head == 0:
            return False, health
        if now - signals.progress_at < policy.stall_after_s:
            return False, health
    return True, replace(health, last_probe_at=now)


def after_probe(health: WorkerHealth, *, is_live: bool) -> tuple[Verdict, WorkerHealth]:
    """The verdict on a probe's answer, and the worker's state after it."""
    if is_live == (not health.is_suspended):
        return Verdict.NONE, health
    if is_live:
        return Verdict.RESUME, replace(health, is_suspended=False)
    return Verdict.SUSPEND, replace(health, is_suspended=True)
