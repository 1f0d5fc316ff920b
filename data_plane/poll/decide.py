"""What poll mode does after a scan: a pure decision on the last state, the scan and the
time (monotonic seconds, passed in), and the state after the attempts.

Per model: new in the repository or changed since its last load attempt, load it; gone,
unload it; unchanged but its last load failed, load it again once the retry time has come
(backing off: the poll interval, doubling after each failure, up to a bound) instead of on
every scan as Triton does; a folder that could not be read this time, leave it be.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Tracked:
    """A model the poller has acted on."""

    snapshot: str
    """The scan of its folder that its last load attempt was made on."""
    failures: int = 0
    """Consecutive failed loads of that snapshot (0: it loaded)."""
    retry_at: float = 0.0
    """When a failed load may be tried again (monotonic seconds)."""


@dataclass(frozen=True, slots=True)
class PollState:
    """Every model the poller has acted on, by name (never mutated: each step returns a
    new state)."""

    models: Mapping[str, Tracked] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long a model whose load failed waits before it is tried again, unchanged."""

    base_s: float
    """After the first failure (the poll interval)."""
    max_s: float
    """The bound the doubling stops at."""

    def delay_s(self, failures: int) -> float:
        return float(min(self.max_s, self.base_s * 2.0 ** max(failures - 1, 0)))


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do after one scan: unload first (freeing what the loads may need)."""

    loads: tuple[str, ...] = ()
    unloads: tuple[str, ...] = ()


def decide(state: PollState, scan: Mapping[str, str | None], now: float) -> Plan:
    """The loads and unloads ``scan`` calls for, in name order."""
    loads = []
    for name in sorted(scan):
        snapshot = scan[name]
        if snapshot is None:
            continue
        tracked = state.models.get(name)
        if tracked is None or tracked.snapshot != snapshot:
            loads.append(name)
        elif tracked.failures and now >= tracked.retry_at:
            loads.append(name)
    unloads = [name for name in sorted(state.models) if name not in scan]
    return Plan(tuple(loads), tuple(unloads))


def after(
    state: PollState,
    scan: Mapping[str, str | None],
    *,
    loaded: Mapping[str, bool],
    unloaded: Iterable[str],
    now: float,
    retry: RetryPolicy,
) -> PollState:
    """The state once the plan was applied: ``loaded`` says which loads succeeded,
    ``unloaded`` names the unloads that did (a failed one is tried at the next scan)."""
    models = dict(state.models)
    for name in unloaded:
        models.pop(name, None)
    for name, ok in loaded.items():
        snapshot = scan.get(name)
        if snapshot is None:
            continue
        if ok:
            models[name] = Tracked(snapshot)
            continue
        previous = models.get(name)
        failures = previous.failures + 1 if previous and previous.snapshot == snapshot else 1
        models[name] = Tracked(snapshot, failures, now + retry.delay_s(failures))
    return PollState(models)
