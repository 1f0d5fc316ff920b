"""Fakes every test package shares. Each component's own fakes (a state store, a pod
backend, workers) stay in its test package's ``fakes.py``."""

from __future__ import annotations

_NS_PER_S = 1_000_000_000
_NS_PER_MS = 1_000_000


class FakeClock:
    """A monotonic clock that moves only when a test moves it.

    Calling it reads seconds, as ``time.monotonic`` (``clock=clock``); `ns` reads
    nanoseconds, as ``time.monotonic_ns`` (``clock=clock.ns``). The time is kept in whole
    nanoseconds, so that moves add up exactly and a deadline lands on its boundary.
    """

    def __init__(self, now: float = 1000.0) -> None:
        self._ns = round(now * _NS_PER_S)

    def __call__(self) -> float:
        return self.now

    @property
    def now(self) -> float:
        """The time in seconds; tests may also set it."""
        return self._ns / _NS_PER_S

    @now.setter
    def now(self, seconds: float) -> None:
        self._ns = round(seconds * _NS_PER_S)

    def ns(self) -> int:
        """The time in nanoseconds."""
        return self._ns

    def advance(self, seconds: float = 0.0, *, ms: float = 0.0) -> None:
        """Move the time forward by ``seconds`` plus ``ms`` milliseconds."""
        self._ns += round(seconds * _NS_PER_S + ms * _NS_PER_MS)
