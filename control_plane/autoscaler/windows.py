"""Time-bucketed sliding windows: KPA's stable and panic averages, and the scale-down-delay max.

Both windows are immutable values. ``record(value, now)`` returns a new window and leaves the
old one as it was; nothing here reads a clock, ``now`` is the caller's monotonic seconds.

Time is cut into buckets of ``bucket_s`` seconds; bucket *k* covers ``[k·bucket_s,
(k+1)·bucket_s)``. At time ``now`` a window spans the ``ceil(window_s / bucket_s)`` buckets
ending with the one that holds ``now``, as Knative's ``aggregation/bucketing.go`` does. A
sample therefore leaves the window exactly when ``now`` reaches its bucket's start plus
``window_s``: with 1 s buckets and a 60 s window, a sample recorded at 10.0 (or 10.9) still
counts at 69.999 and is gone at 70.0.

Unlike Knative, a bucket no sample landed in is absent, not zero. Knative fills every bucket by
scraping pods each second; our autoscaler loop records once per tick, and a tick slower than
``bucket_s`` would otherwise read as idle time. The loop records explicit zeros when it sees no
traffic, so "no concurrency" is still visible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple, Self

__all__ = ["Bucket", "Peak", "WindowedAverage", "WindowedMax"]

# A millionth of a bucket. It absorbs float error in ``now / bucket_s`` (0.3 / 0.1 ==
# 2.9999999999999996, 3.0 / 0.1 == 30.000000000000004) so a sample lands in, and leaves, the
# bucket a reader of the numbers would expect.
_EPS = 1e-6


def _validate(window_s: float, bucket_s: float) -> None:
    # Written as "not (x > 0)" so that NaN fails too.
    if not (bucket_s > 0 and math.isfinite(bucket_s)):
        raise ValueError(f"bucket_s must be a positive number of seconds, got {bucket_s!r}")
    if not (window_s > 0 and math.isfinite(window_s)):
        raise ValueError(f"window_s must be a positive number of seconds, got {window_s!r}")


def _bucket_start(now: float, bucket_s: float) -> float:
    return math.floor(now / bucket_s + _EPS) * bucket_s


def _oldest_start(now: float, window_s: float, bucket_s: float) -> float:
    """Start of the oldest bucket still inside the window at ``now``."""
    index = math.floor(now / bucket_s + _EPS)
    count = max(1, math.ceil(window_s / bucket_s - _EPS))
    # Starts are always computed as integer * bucket_s, so comparing them is exact.
    return (index - count + 1) * bucket_s


class Bucket(NamedTuple):
    """The samples recorded in one bucket of a ``WindowedAverage``."""

    start_s: float
    """Where the bucket begins: a whole multiple of the window's bucket_s."""
    total: float
    """Sum of the values recorded in it."""
    samples: int
    """How many values were recorded in it (at least one)."""

    @property
    def mean(self) -> float:
        return self.total / self.samples


@dataclass(frozen=True, slots=True)
class WindowedAverage:
    """Average of the samples recorded over the last ``window_s`` seconds.

    Samples in one bucket are averaged first, then every bucket in the window counts once, so a
    burst of extra records in one second (an activator poke between ticks) does not outweigh
    the rest of the window. With nothing in the window the average is 0.0.
    """

    window_s: float
    bucket_s: float = 1.0
    buckets: tuple[Bucket, ...] = ()
    """Oldest first, at most one per bucket start, pruned to the window on every record."""

    def __post_init__(self) -> None:
        _validate(self.window_s, self.bucket_s)

    def record(self, value: float, now: float) -> Self:
        """A window that also holds ``value`` observed at ``now``; drops expired buckets.

        ``now`` earlier than the newest bucket (a clock that went backwards, which a monotonic
        clock does not) adds to the newest bucket rather than rewriting history.
        """
        start = _bucket_start(now, self.bucket_s)
        live = self._live(now)
        if live and live[-1].start_s >= start:
            newest = live[-1]
            live = (*live[:-1], Bucket(newest.start_s, newest.total + value, newest.samples + 1))
        else:
            live = (*live, Bucket(start, value, 1))
        return replace(self, buckets=live)

    def average(self, now: float) -> float:
        """Mean of the per-bucket means inside the window at ``now``; 0.0 when it is empty."""
        live = self._live(now)
        if not live:
            return 0.0
        return sum(bucket.mean for bucket in live) / len(live)

    def _live(self, now: float) -> tuple[Bucket, ...]:
        oldest = _oldest_start(now, self.window_s, self.bucket_s)
        return tuple(bucket for bucket in self.buckets if bucket.start_s >= oldest)


class Peak(NamedTuple):
    """The largest value recorded in one bucket of a ``WindowedMax``."""

    start_s: float
    """Where the bucket begins: a whole multiple of the window's bucket_s."""
    value: float
    """Largest value recorded in it."""


@dataclass(frozen=True, slots=True)
class WindowedMax:
    """Largest sample recorded over the last ``window_s`` seconds (Knative's ``max.TimeWindow``).

    The autoscaler feeds it each decision to hold scale-downs for ``scale_down_delay_s``.
    """

    window_s: float
    bucket_s: float = 1.0
    peaks: tuple[Peak, ...] = ()
    """Oldest first, at most one per bucket start, pruned to the window on every record."""

    def __post_init__(self) -> None:
        _validate(self.window_s, self.bucket_s)

    def record(self, value: float, now: float) -> Self:
        """A window that also holds ``value`` observed at ``now``; drops expired buckets."""
        start = _bucket_start(now, self.bucket_s)
        live = self._live(now)
        if live and live[-1].start_s >= start:
            newest = live[-1]
            live = (*live[:-1], Peak(newest.start_s, max(newest.value, value)))
        else:
            live = (*live, Peak(start, value))
        return replace(self, peaks=live)

    def maximum(self, now: float) -> float:
        """Largest value inside the window at ``now``; 0.0 when it is empty."""
        return max((peak.value for peak in self._live(now)), default=0.0)

    def _live(self, now: float) -> tuple[Peak, ...]:
        oldest = _oldest_start(now, self.window_s, self.bucket_s)
        return tuple(peak for peak in self.peaks if peak.start_s >= oldest)
