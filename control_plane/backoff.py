"""When a model's next activation may start after activations that failed for a passing
reason (the store unreachable, no capacity, a worker dying): a pure decision.

Each failure in a row doubles the wait, from ``initial_s`` up to ``max_s``; a success
forgets the model's record. Requests that arrive meanwhile are answered 503 with the time
left as ``Retry-After`` instead of starting another activation, so a model whose store is
down costs one activation per wait, however many clients retry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Backoff", "BackoffPolicy", "after_failure", "retry_after_s", "wait_s"]


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """How long activations wait after failures in a row."""

    initial_s: float
    """The wait after the first failure."""
    max_s: float
    """The longest wait, however many failures."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """One model's failures in a row and when its next activation may start."""

    failures: int
    not_before: float
    """Clock seconds (the caller's clock)."""
    reason: str
    """The last failure's message."""


def after_failure(state: Backoff | None, now: float, policy: BackoffPolicy, reason: str) -> Backoff:
    """The record after one more failure at ``now``."""
    failures = (state.failures if state is not None else 0) + 1
    delay_s = min(policy.max_s, policy.initial_s * 2 ** min(failures - 1, 32))
    return Backoff(failures=failures, not_before=now + delay_s, reason=reason)


def wait_s(state: Backoff | None, now: float) -> float:
    """Seconds before the next activation may start; 0 when it may now."""
    if state is None:
        return 0.0
    return max(0.0, state.not_before - now)


def retry_after_s(wait: float) -> int:
    """``wait`` as a ``Retry-After`` value: whole seconds, at least 1."""
    return max(1, math.ceil(wait))
