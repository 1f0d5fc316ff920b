"""Replay traffic through keep-alive policies on a simulated clock (``zeroserve simulate``).

For each model the busy periods of its trace leave idle gaps. Each gap is handled by the
plan the policy's own ``decide`` gave at the last decision point before the gap began, with
the history it had then (decisions are refreshed every ``replan_s`` of simulated time, as
the reaper refreshes them every sweep; the history learns each gap once it has ended), and
:func:`~control_plane.keepalive.plan.outcome` says what the plan cost on it. Nothing
sleeps: a 14-day trace of 100 models replays in seconds.

Simplifications, the same for every policy: a request that waits for a load does not shift
the busy period behind it, one replica serves a model's whole load, and after the last
request the trace's end cuts the final gap (no cold start is counted there).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from control_plane.keepalive.history import IdleHistory
from control_plane.keepalive.plan import KeepAlivePlan, Outcome, oracle_outcome, outcome
from control_plane.keepalive.policies import (
    AdaptivePolicy,
    KeepAlivePolicy,
    choose_for_targets,
)
from control_plane.keepalive.traces import ModelTrace

__all__ = ["ORACLE", "PolicyResult", "replay"]

ORACLE = "oracle"
"""The name of the offline oracle's row (it knows every gap; a lower bound)."""


@dataclass(slots=True)
class PolicyResult:
    """One policy over all models of a trace."""

    policy: str
    family: str
    requests: int = 0
    cold_starts: int = 0
    activations: int = 0
    """Loads: cold starts and pre-warms."""
    serving_s: float = 0.0
    idle_s: float = 0.0
    loading_s: float = 0.0
    always_on_s: float = 0.0
    horizon_s: float = 0.0
    per_model_cold_share: list[float] = field(default_factory=list)
    """Each model's cold starts per request, models with requests only."""
    latency_values: list[NDArray[np.float64]] = field(default_factory=list)
    latency_weights: list[NDArray[np.float64]] = field(default_factory=list)

    @property
    def cold_start_rate(self) -> float:
        """Mean over models of each model's cold-start share of its requests: every
        endpoint counts the same, whatever its volume."""
        shares = self.per_model_cold_share
        return float(np.mean(shares)) if shares else 0.0

    @property
    def cold_start_rate_p75(self) -> float:
        shares = self.per_model_cold_share
        return float(np.percentile(shares, 75)) if shares else 0.0

    @property
    def cold_start_rate_requests(self) -> float:
        """Cold starts over all requests (dominated by the busiest models)."""
        return self.cold_starts / self.requests if self.requests else 0.0

    @property
    def wasted_share(self) -> float:
        """Replica-seconds idle and loading as a share of always-on's."""
        return (self.idle_s + self.loading_s) / self.always_on_s if self.always_on_s else 0.0

    @property
    def idle_share(self) -> float:
        return self.idle_s / self.always_on_s if self.always_on_s else 0.0

    @property
    def loading_share(self) -> float:
        return self.loading_s / self.always_on_s if self.always_on_s else 0.0

    @property
    def activations_per_hour(self) -> float:
        return self.activations / (self.horizon_s / 3600.0) if self.horizon_s else 0.0

    def latency_percentile(self, q: float) -> float:
        """Added latency at percentile ``q`` over requests, each model's requests weighing
        the same in total (as in :attr:`cold_start_rate`)."""
        if not self.latency_values:
            return 0.0
        values = np.concatenate(self.latency_values)
        weights = np.concatenate(self.latency_weights)
        order = np.argsort(values, kind="stable")
        cumulative = np.cumsum(weights[order])
        i = int(np.searchsorted(cumulative, cumulative[-1] * q / 100.0, side="left"))
        return float(values[order][min(i, len(values) - 1)])

    def summary(self) -> dict[str, float | str | int]:
        return {
            "policy": self.policy,
            "family": self.family,
            "cold_start_rate": self.cold_start_rate,
            "cold_start_rate_p75": self.cold_start_rate_p75,
            "cold_start_rate_requests": self.cold_start_rate_requests,
            "added_latency_p50_s": self.latency_percentile(50),
            "added_latency_p99_s": self.latency_percentile(99),
            "added_latency_p999_s": self.latency_percentile(99.9),
            "idle_share": self.idle_share,
            "loading_share": self.loading_share,
            "wasted_share": self.wasted_share,
            "activations_per_hour": self.activations_per_hour,
            "requests": self.requests,
            "cold_starts": self.cold_starts,
        }


def replay(
    traces: Sequence[ModelTrace],
    policies: Sequence[KeepAlivePolicy],
    *,
    load_s: float | Mapping[str, float],
    bound_s: float,
    replan_s: float = 600.0,
    families: Mapping[str, str] | None = None,
    oracle: bool = True,
) -> list[PolicyResult]:
    """Every policy (and the oracle) over every model with requests.

    ``load_s``: one load time for all models, or per model name (a missing name is an
    error). ``bound_s``: each model's ``idle_timeout_s``. ``families`` names each policy's
    curve (default: its type)."""
    names = [p.name for p in policies] + ([ORACLE] if oracle else [])
    fams = dict(families or {})
    results = {
        name: PolicyResult(policy=name, family=fams.get(name, _family(p)))
        for name, p in zip(names, [*policies, None], strict=False)
    }
    for trace in traces:
        if trace.requests == 0:
            continue
        load = load_s if isinstance(load_s, (int, float)) else load_s[trace.name]
        for name, out in _replay_model(trace, policies, float(load), bound_s, replan_s):
            _account(results[name], trace, out, float(load))
        if oracle:
            # The oracle unloads at once after the last request: its final gap costs nothing.
            gaps, _, _ = _gaps(trace)
            out = oracle_outcome(gaps, load_s=float(load))
            out.idle_s[0], out.loading_s[0] = 0.0, float(load)  # loaded just in time
            _account(results[ORACLE], trace, out, float(load))
    return [results[n] for n in names]


def _family(policy: KeepAlivePolicy | None) -> str:
    if policy is None:
        return ORACLE
    return policy.name.split(" ")[0]


def _gaps(
    trace: ModelTrace,
) -> tuple[NDArray[np.float64], NDArray[np.float64], float]:
    """Idle gaps (the first from the trace's start to the first request), when each began,
    and the cut-off final one."""
    ends = trace.last + trace.hold_s
    began = np.concatenate(([0.0], ends[:-1]))
    gaps = trace.start - began
    tail = max(0.0, trace.horizon_s - float(ends[-1]))
    return gaps, began, tail


def _replay_model(
    trace: ModelTrace,
    policies: Sequence[KeepAlivePolicy],
    load_s: float,
    bound_s: float,
    replan_s: float,
) -> list[tuple[str, Outcome]]:
    gaps, began, tail = _gaps(trace)
    # Decision points: the grid ticks at which some gap begins (the tail's start too).
    all_began = np.append(began, trace.horizon_s - tail)
    all_gaps = np.append(gaps, tail)
    tick = np.floor(all_began / replan_s)
    ticks, which = np.unique(tick, return_inverse=True)
    decided_at = ticks * replan_s
    ended = trace.start  # gap i ended when busy period i began
    plans: dict[str, list[KeepAlivePlan]] = {p.name: [] for p in policies}
    stateless = [p for p in policies if not _reads_history(p)]
    for p in stateless:
        plan = p.decide(p.new_history(), bound_s=bound_s, load_s=load_s, now=0.0)
        plans[p.name] = [plan] * len(ticks)
    groups: dict[tuple[object, ...], list[KeepAlivePolicy]] = {}
    for p in policies:
        if _reads_history(p):
            groups.setdefault(_history_key(p), []).append(p)
    for members in groups.values():
        _decide_group(members, plans, trace, decided_at, ended, gaps, bound_s, load_s)
    out = []
    for p in policies:
        sequence = plans[p.name]
        keep = np.array([pl.keep_alive_s for pl in sequence])[which]
        ready = np.array(
            [math.nan if pl.prewarm_at_s is None else pl.prewarm_at_s for pl in sequence]
        )[which]
        window = np.array([pl.prewarm_window_s for pl in sequence])[which]
        result = outcome(
            all_gaps, keep_alive_s=keep, prewarm_at_s=ready, prewarm_window_s=window, load_s=load_s
        )
        body = Outcome(
            cold=result.cold[:-1],
            added_latency_s=result.added_latency_s[:-1],
            idle_s=result.idle_s[:-1],
            loading_s=result.loading_s[:-1],
        )
        last = Outcome(
            cold=result.cold[-1:],
            added_latency_s=result.added_latency_s[-1:],
            idle_s=result.idle_s[-1:],
            loading_s=result.loading_s[-1:],
        )
        body = _first(body, float(keep[0]), load_s)
        out.append((p.name, _join(body, _cut(last, load_s))))
    return out


def _decide_group(
    members: list[KeepAlivePolicy],
    plans: dict[str, list[KeepAlivePlan]],
    trace: ModelTrace,
    decided_at: NDArray[np.float64],
    ended: NDArray[np.float64],
    gaps: NDArray[np.float64],
    bound_s: float,
    load_s: float,
) -> None:
    """Decisions of policies reading the same history, learning it once for all of them."""
    history: IdleHistory = members[0].new_history()
    learned = 0
    # Gaps (and the requests of the busy periods they end) become known when they end.
    known = np.searchsorted(ended, decided_at, side="right")
    shared_adaptive = all(isinstance(p, AdaptivePolicy) for p in members)
    for at, upto in zip(decided_at.tolist(), known.tolist(), strict=True):
        if upto > learned:
            history = history.observe(
                gaps[learned:upto],
                ended_at=ended[learned:upto],
                requests=float(trace.count[learned:upto].sum()),
                now=at,
            )
            learned = upto
        elif plans[members[0].name] and not _may_change(members, history, at):
            # Decay scales every count alike, and the plans depend on the counts' shape
            # only: without a new idle time they stay as they are.
            for p in members:
                plans[p.name].append(plans[p.name][-1])
            continue
        if shared_adaptive:
            _decide_adaptive(members, plans, history, bound_s, load_s, at)
            continue
        for p in members:
            plans[p.name].append(p.decide(history, bound_s=bound_s, load_s=load_s, now=at))


def _decide_adaptive(
    members: list[KeepAlivePolicy],
    plans: dict[str, list[KeepAlivePlan]],
    history: IdleHistory,
    bound_s: float,
    load_s: float,
    at: float,
) -> None:
    # The members differ only in their target: price the candidates once.
    first = members[0]
    assert isinstance(first, AdaptivePolicy)
    seen = history.decayed_to(at)
    if seen.gaps < first.min_gaps or seen.requests <= 0:
        for p in members:
            plans[p.name].append(p.decide(seen, bound_s=bound_s, load_s=load_s, now=at))
        return
    candidates = first.candidates(seen, bound_s=bound_s, load_s=load_s)
    targets = [p.cold_start_target for p in members if isinstance(p, AdaptivePolicy)]
    for p, plan in zip(members, choose_for_targets(candidates, targets), strict=True):
        plans[p.name].append(plan)


def _may_change(members: list[KeepAlivePolicy], history: IdleHistory, at: float) -> bool:
    """Whether decay alone may change a decision: it may push an adaptive policy's
    history below its minimum and so into the fallback."""
    first = members[0]
    if not isinstance(first, AdaptivePolicy):
        return False
    before = history.gaps >= first.min_gaps
    return before != (history.decayed_to(at).gaps >= first.min_gaps)


def _reads_history(policy: KeepAlivePolicy) -> bool:
    return type(policy).new_history is not KeepAlivePolicy.new_history


def _history_key(policy: KeepAlivePolicy) -> tuple[object, ...]:
    empty = policy.new_history()
    key: tuple[object, ...] = (type(policy), empty.edges, empty.half_life_s, empty.keep_recent)
    if isinstance(policy, AdaptivePolicy):
        key += (policy.min_gaps, policy.fallback_keep_alive_s)
    return key


def _first(body: Outcome, keep_alive_s: float, load_s: float) -> Outcome:
    """The time before the first request: the model starts unloaded, so the first request
    is a cold start, except under a policy that never unloads (loaded from the start)."""
    if math.isinf(keep_alive_s):
        return body
    body.cold[0], body.added_latency_s[0] = True, load_s
    body.idle_s[0], body.loading_s[0] = 0.0, load_s
    return body


def _cut(last: Outcome, load_s: float) -> Outcome:
    """The final gap, cut by the trace's end: no request ends it, so nothing is cold and
    the cold start's load never happens."""
    return Outcome(
        cold=np.zeros(1, np.bool_),
        added_latency_s=np.zeros(1),
        idle_s=last.idle_s,
        loading_s=last.loading_s - np.where(last.cold, load_s, 0.0),
    )


def _join(a: Outcome, b: Outcome) -> Outcome:
    return Outcome(
        cold=np.concatenate((a.cold, b.cold)),
        added_latency_s=np.concatenate((a.added_latency_s, b.added_latency_s)),
        idle_s=np.concatenate((a.idle_s, b.idle_s)),
        loading_s=np.concatenate((a.loading_s, b.loading_s)),
    )


def _account(result: PolicyResult, trace: ModelTrace, out: Outcome, load_s: float) -> None:
    requests = trace.requests
    cold = int(out.cold.sum())
    result.requests += requests
    result.cold_starts += cold
    if load_s > 0:
        result.activations += int(round(float(out.loading_s.sum()) / load_s))
    result.serving_s += trace.busy_s
    result.idle_s += float(out.idle_s.sum())
    result.loading_s += float(out.loading_s.sum())
    result.always_on_s += trace.horizon_s
    result.horizon_s = max(result.horizon_s, trace.horizon_s)
    result.per_model_cold_share.append(cold / requests)
    latencies = out.added_latency_s[out.cold]
    result.latency_values.append(np.concatenate((latencies, [0.0])))
    weights = np.full(len(latencies), 1.0 / requests)
    result.latency_weights.append(np.concatenate((weights, [(requests - cold) / requests])))
