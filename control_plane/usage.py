"""What each model costs: replica-seconds serving, idle and loading, and its cold starts.

A ledger per model of hourly buckets (wall clock), bounded to ``KEEP_S`` of history, kept
in the state store under the model's ``usage`` state. The reaper, which sweeps every
second, is its one writer: each sweep adds the time since the last one to every loaded
replica, as serving while the model has requests in flight and as idle otherwise, and folds
in the activations finished since (their load time as loading; a cold start when a request
triggered it, with the time that request waited). So for every replica, serving + idle is
the time it was loaded (to within a sweep) and loading the time it took to get there.
On CPU pools the same figures are device-seconds of CPU workers.

Pure values: :func:`add` and :func:`totals` return, never mutate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Self

__all__ = [
    "BUCKET_S",
    "KEEP_S",
    "STATE_KEY",
    "Usage",
    "UsageLedger",
    "add",
    "fold_activations",
    "totals",
]

BUCKET_S = 3600.0
"""Bucket width: usage over a range is exact to the hour."""
KEEP_S = 31 * 86400.0
"""History kept per model (older buckets are dropped)."""
STATE_KEY = "usage"


@dataclass(frozen=True, slots=True)
class Usage:
    """Usage of one model over some time."""

    serving_s: float = 0.0
    """Replica-seconds loaded with requests in flight."""
    idle_s: float = 0.0
    """Replica-seconds loaded without a request."""
    loading_s: float = 0.0
    """Replica-seconds spent loading (cold starts and pre-warms)."""
    activations: int = 0
    cold_starts: int = 0
    """Activations a request waited for."""
    cold_start_wait_s: float = 0.0
    """Time those requests waited, summed."""

    def plus(self, other: Usage) -> Usage:
        return Usage(
            serving_s=self.serving_s + other.serving_s,
            idle_s=self.idle_s + other.idle_s,
            loading_s=self.loading_s + other.loading_s,
            activations=self.activations + other.activations,
            cold_starts=self.cold_starts + other.cold_starts,
            cold_start_wait_s=self.cold_start_wait_s + other.cold_start_wait_s,
        )

    def scaled(self, share: float) -> Usage:
        """A share of this usage (counts are not split: they stay whole)."""
        return Usage(
            serving_s=self.serving_s * share,
            idle_s=self.idle_s * share,
            loading_s=self.loading_s * share,
            activations=self.activations,
            cold_starts=self.cold_starts,
            cold_start_wait_s=self.cold_start_wait_s,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "serving_s": self.serving_s,
            "idle_s": self.idle_s,
            "loading_s": self.loading_s,
            "activations": self.activations,
            "cold_starts": self.cold_starts,
            "cold_start_wait_s": self.cold_start_wait_s,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        return cls(
            serving_s=float(doc.get("serving_s", 0.0)),
            idle_s=float(doc.get("idle_s", 0.0)),
            loading_s=float(doc.get("loading_s", 0.0)),
            activations=int(doc.get("activations", 0)),
            cold_starts=int(doc.get("cold_starts", 0)),
            cold_start_wait_s=float(doc.get("cold_start_wait_s", 0.0)),
        )


@dataclass(frozen=True, slots=True)
class UsageLedger:
    """Hourly buckets of one model's usage, and the activations already counted."""

    buckets: dict[int, Usage] = field(default_factory=dict)
    """Bucket start (wall-clock seconds, a multiple of ``BUCKET_S``) -> its usage."""
    counted: tuple[str, ...] = ()
    """Ids of the newest activation timelines already folded in."""
    accounted_at: float | None = None
    """Wall-clock time loaded replicas are accounted up to (a failed-over reaper goes on
    from there)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "buckets": {str(k): v.to_json() for k, v in sorted(self.buckets.items())},
            "counted": list(self.counted),
            "accounted_at": self.accounted_at,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        return cls(
            buckets={int(k): Usage.from_json(v) for k, v in doc.get("buckets", {}).items()},
            counted=tuple(doc.get("counted", ())),
            accounted_at=doc.get("accounted_at"),
        )


def add(ledger: UsageLedger, usage: Usage, *, start: float, end: float) -> UsageLedger:
    """``usage``, accrued evenly over [start, end) (a point when equal), added to its
    buckets; buckets older than ``KEEP_S`` before ``end`` are dropped."""
    buckets = dict(ledger.buckets)
    span = end - start
    first = math.floor(start / BUCKET_S)
    last = math.floor(end / BUCKET_S) if span > 0 else first
    for index in range(first, last + 1):
        lo, hi = index * BUCKET_S, (index + 1) * BUCKET_S
        share = 1.0 if span <= 0 else max(0.0, min(end, hi) - max(start, lo)) / span
        if share <= 0 and span > 0:
            continue
        part = usage.scaled(share)
        if index != first:  # counts go to the first bucket only
            part = Usage(serving_s=part.serving_s, idle_s=part.idle_s, loading_s=part.loading_s)
        key = int(lo)
        buckets[key] = buckets.get(key, Usage()).plus(part)
    horizon = end - KEEP_S
    buckets = {k: v for k, v in buckets.items() if k + BUCKET_S > horizon}
    return UsageLedger(buckets=buckets, counted=ledger.counted, accounted_at=ledger.accounted_at)


def fold_activations(
    ledger: UsageLedger, timelines: list[dict[str, Any]]
) -> tuple[UsageLedger, list[Usage]]:
    """``ledger`` with the activations among ``timelines`` (the store's, newest first) not
    counted yet, and each one's usage. Only activations that left a replica count: a load
    (``durations_s.load``) or a wake (``wake``) is loading time; one triggered by a request
    is a cold start, which made that request wait ``durations_s.total``."""
    added: list[Usage] = []
    for timeline in reversed(timelines):
        if timeline.get("id") in ledger.counted:
            continue
        if timeline.get("outcome") not in ("ready", "revived", "woken"):
            continue
        durations = timeline.get("durations_s") or {}
        loading = float(durations.get("load", durations.get("wake", 0.0)) or 0.0)
        is_cold = timeline.get("trigger") == "request"
        one = Usage(
            loading_s=loading,
            activations=1,
            cold_starts=int(is_cold),
            cold_start_wait_s=float(durations.get("total", 0.0) or 0.0) if is_cold else 0.0,
        )
        at = float(timeline.get("queued_at") or 0.0)
        ledger = add(ledger, one, start=at, end=at)
        added.append(one)
    counted = tuple(str(t["id"]) for t in timelines if isinstance(t.get("id"), str))
    return (
        UsageLedger(buckets=ledger.buckets, counted=counted, accounted_at=ledger.accounted_at),
        added,
    )


def totals(ledger: UsageLedger, *, start: float, end: float) -> Usage:
    """Usage in the buckets that overlap [start, end)."""
    total = Usage()
    for key, usage in ledger.buckets.items():
        if key < end and key + BUCKET_S > start:
            total = total.plus(usage)
    return total
