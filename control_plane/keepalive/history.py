"""A model's idle times: a fixed-size histogram whose counts decay with age.

An idle time is the gap between the end of a model's last request (nothing in flight) and
the arrival of its next one. Memory is bounded by the bin edges, whatever the traffic; old
observations fade with ``half_life_s`` so a model whose pattern drifts is judged by its
recent past. Gaps beyond the last edge land in an overflow count. A history made with
``keep_recent`` also keeps that many of the latest idle times in order (for a time-series
forecast). Pure values: every update returns a new history.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["IdleHistory", "geometric_edges", "minute_edges"]


def geometric_edges(first_s: float = 5.0, last_s: float = 4 * 3600.0) -> tuple[float, ...]:
    """0, then ``first_s`` growing by a factor sqrt(2) up to at least ``last_s``.

    Relative resolution is what a keep-alive decision needs: telling 10 s from 20 s matters
    as much as telling 1 h from 2 h, and about 25 bins cover 5 s to 4 h."""
    edges = [0.0, first_s]
    while edges[-1] < last_s:
        edges.append(edges[-1] * math.sqrt(2.0))
    return tuple(edges)


def minute_edges(minutes: int = 240) -> tuple[float, ...]:
    """1-minute bins over ``minutes`` (the published hybrid policy uses 4 hours)."""
    return tuple(60.0 * i for i in range(minutes + 1))


@dataclass(frozen=True, slots=True)
class IdleHistory:
    """Decayed counts of idle times per bin, and of the requests they separated."""

    edges: tuple[float, ...]
    """Bin edges in seconds, increasing, starting at 0; bin i is [edges[i], edges[i+1])."""
    counts: NDArray[np.float64]
    """Decayed count per bin (len(edges) - 1 bins); never written to."""
    overflow: float = 0.0
    """Decayed count of idle times at or beyond the last edge."""
    requests: float = 0.0
    """Decayed count of requests seen, to turn cold starts per idle time into per request."""
    updated_at: float | None = None
    """Clock reading the counts are decayed to; None: never updated."""
    half_life_s: float = 0.0
    """Counts halve every this many seconds; 0: they never decay."""
    recent: tuple[float, ...] = ()
    """The latest idle times, oldest first, at most ``keep_recent`` of them (undecayed)."""
    keep_recent: int = 0
    """How many of the latest idle times ``recent`` keeps; 0: none."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IdleHistory):
            return NotImplemented
        return (
            self.edges == other.edges
            and np.array_equal(self.counts, other.counts)
            and (self.overflow, self.requests, self.updated_at, self.half_life_s)
            == (other.overflow, other.requests, other.updated_at, other.half_life_s)
            and (self.recent, self.keep_recent) == (other.recent, other.keep_recent)
        )

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def empty(
        cls, edges: Sequence[float], *, half_life_s: float = 0.0, keep_recent: int = 0
    ) -> Self:
        steps = np.diff(np.asarray(edges, dtype=np.float64))
        if len(edges) < 2 or edges[0] != 0.0 or bool(np.any(steps <= 0)):
            raise ValueError("edges must start at 0 and increase")
        if keep_recent < 0:
            raise ValueError("keep_recent must be >= 0")
        return cls(
            edges=tuple(float(e) for e in edges),
            counts=np.zeros(len(edges) - 1),
            half_life_s=half_life_s,
            keep_recent=keep_recent,
        )

    @property
    def gaps(self) -> float:
        """Decayed number of idle times observed (overflow included)."""
        return float(self.counts.sum()) + self.overflow

    def decayed_to(self, now: float) -> Self:
        """The same history seen from ``now``; a clock that went back decays nothing."""
        factor = self._factor(now)
        if self.updated_at is not None and now <= self.updated_at:
            return self
        return type(self)(
            edges=self.edges,
            counts=self.counts * factor,
            overflow=self.overflow * factor,
            requests=self.requests * factor,
            updated_at=now,
            half_life_s=self.half_life_s,
            recent=self.recent,
            keep_recent=self.keep_recent,
        )

    def observe(
        self,
        idle_s: ArrayLike,
        *,
        ended_at: ArrayLike,
        requests: float,
        now: float,
    ) -> Self:
        """Add idle times (seconds, one or many) that ended at ``ended_at`` and ``requests``
        requests seen since the last update, all decayed to ``now``.

        Observations stamped after ``now`` (a clock that jumped back) count as of ``now``.
        """
        idle = np.atleast_1d(np.asarray(idle_s, dtype=np.float64))
        ended = np.asarray(ended_at, dtype=np.float64)
        base = self.decayed_to(now)
        at = base.updated_at if base.updated_at is not None else now
        weights = np.broadcast_to(_weights(self.half_life_s, np.minimum(ended, at), at), idle.shape)
        index = np.searchsorted(self.edges, np.maximum(idle, 0.0), side="right") - 1
        inside = index < len(self.counts)
        added = np.bincount(index[inside], weights[inside], minlength=len(self.counts))
        recent = self.recent
        if self.keep_recent:
            latest = np.maximum(idle[-self.keep_recent :], 0.0).tolist()
            recent = (*recent, *latest)[-self.keep_recent :]
        return type(self)(
            edges=self.edges,
            counts=base.counts + added,
            overflow=base.overflow + float(weights[~inside].sum()),
            requests=base.requests + float(requests),
            updated_at=at,
            half_life_s=self.half_life_s,
            recent=recent,
            keep_recent=self.keep_recent,
        )

    def arrays(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(edges, counts with the overflow appended as a last bin ending at infinity)."""
        return np.asarray(self.edges), np.append(self.counts, self.overflow)

    def to_json(self) -> dict[str, Any]:
        return {
            "edges": list(self.edges),
            "counts": self.counts.tolist(),
            "overflow": self.overflow,
            "requests": self.requests,
            "updated_at": self.updated_at,
            "half_life_s": self.half_life_s,
            "recent": list(self.recent),
            "keep_recent": self.keep_recent,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        return cls(
            edges=tuple(float(e) for e in doc["edges"]),
            counts=np.asarray(doc["counts"], dtype=np.float64),
            overflow=float(doc.get("overflow", 0.0)),
            requests=float(doc.get("requests", 0.0)),
            updated_at=doc.get("updated_at"),
            half_life_s=float(doc.get("half_life_s", 0.0)),
            recent=tuple(float(v) for v in doc.get("recent", ())),
            keep_recent=int(doc.get("keep_recent", 0)),
        )

    def _factor(self, now: float) -> float:
        if self.updated_at is None or self.half_life_s <= 0 or now <= self.updated_at:
            return 1.0
        return float(0.5 ** ((now - self.updated_at) / self.half_life_s))


def _weights(half_life_s: float, when: NDArray[np.float64], now: float) -> NDArray[np.float64]:
    if half_life_s <= 0:
        return np.ones_like(when)
    return np.asarray(0.5 ** ((now - when) / half_life_s), dtype=np.float64)
