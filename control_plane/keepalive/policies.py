"""Keep-alive policies: from a model's idle-time history to a plan for its idle period.

Every policy is a pure ``decide(history, bound_s=, load_s=, now=) -> (plan, history)``:
``bound_s`` is the model's ``idle_timeout_s`` (no plan keeps a replica idle longer),
``load_s`` how long the model takes to load. Policies never sleep and read no clock.

* :class:`AlwaysOnPolicy` never unloads (the cost ceiling).
* :class:`FixedPolicy` unloads after a fixed time: the platforms' default (Knative 60 s,
  AWS Lambda ~10 min, Azure Functions 20 min, zeroserve's ``idle_timeout_s``).
* :class:`HybridHistogramPolicy` is Azure Functions' policy as published (Shahrad et al.,
  "Serverless in the Wild", ATC'20).
* :class:`AdaptivePolicy` is zeroserve's: the cheapest plan, over a decaying histogram,
  whose predicted cold-start share of the model's requests meets a target.
"""

from __future__ import annotations

import abc
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from control_plane.keepalive.forecast import forecast_next
from control_plane.keepalive.history import IdleHistory, geometric_edges, minute_edges
from control_plane.keepalive.plan import KeepAlivePlan

__all__ = [
    "AdaptivePolicy",
    "AlwaysOnPolicy",
    "Candidates",
    "FixedPolicy",
    "HybridHistogramPolicy",
    "KeepAlivePolicy",
    "PolicyName",
    "choose_for_targets",
    "policy_for",
]

PolicyName = Literal["fixed", "adaptive"]


class KeepAlivePolicy(abc.ABC):
    """Decides a model's keep-alive and pre-warm from its history of idle times."""

    name: str = ""

    def new_history(self) -> IdleHistory:
        """An empty history of the shape this policy reads."""
        return IdleHistory.empty((0.0, 1.0))

    @abc.abstractmethod
    def decide(
        self, history: IdleHistory, *, bound_s: float, load_s: float, now: float
    ) -> KeepAlivePlan:
        """The plan for an idle period starting around ``now``; pure and cheap (the reaper
        calls it for every idle model on every sweep). Never keeps longer than ``bound_s``."""


class AlwaysOnPolicy(KeepAlivePolicy):
    """Never unload: no cold start after the first, every idle second paid."""

    name = "always-on"

    def decide(
        self, history: IdleHistory, *, bound_s: float, load_s: float, now: float
    ) -> KeepAlivePlan:
        return KeepAlivePlan(keep_alive_s=math.inf, reason="always-on")


@dataclass(frozen=True, slots=True)
class FixedPolicy(KeepAlivePolicy):
    """Unload after ``keep_alive_s`` idle (None: after the bound, ``idle_timeout_s``)."""

    keep_alive_s: float | None = None
    label: str = ""
    """A name for tables (say ``knative 60 s``); default ``fixed <time>``."""

    @property
    def name(self) -> str:  # type: ignore[override]
        if self.label:
            return self.label
        if self.keep_alive_s is None:
            return "fixed"
        return f"fixed {_duration(self.keep_alive_s)}"

    def decide(
        self, history: IdleHistory, *, bound_s: float, load_s: float, now: float
    ) -> KeepAlivePlan:
        keep = bound_s if self.keep_alive_s is None else min(self.keep_alive_s, bound_s)
        return KeepAlivePlan(keep_alive_s=keep, reason="fixed keep-alive")


@dataclass(frozen=True, slots=True)
class HybridHistogramPolicy(KeepAlivePolicy):
    """Shahrad et al.'s hybrid histogram policy, as published (ATC'20, section 4.2).

    Per application, a histogram of idle times in 1-minute bins over 4 hours. While it is
    representative (at least ``min_gaps`` idle times, the coefficient of variation of its
    bin counts at least ``cv_threshold``, out-of-range idle times a minority) the
    application is unloaded right after a request and pre-warmed at the 5th percentile of
    idle times (less a 10 % margin), then kept until the 99th (plus 10 %); when the 5th
    percentile is in the first bin, it is not unloaded but kept until the 99th. When more
    than ``oob_max_share`` of the idle times lie beyond the range, the next idle time is
    forecast from the last ``recent_gaps`` of them (the paper's ARIMA; here an
    ARIMA(p, 1, 0) fitted by least squares, :func:`forecast_next`) and the application is
    unloaded at once, pre-warmed at the forecast less ``forecast_margin`` (15 %) and kept
    for twice that margin (until the forecast plus 15 %), as the paper sets its windows.
    Otherwise (a histogram that is not representative, or too few recent idle times to
    forecast) it falls back to a fixed keep-alive of the histogram's range.

    The pre-warm here has the model *ready* at the head percentile or the forecast's lower
    margin (loading starts a load time earlier), which is kinder to the policy than the
    paper's start-loading-then (its loads took well under a second).
    """

    head_percentile: float = 5.0
    tail_percentile: float = 99.0
    margin: float = 0.10
    cv_threshold: float = 2.0
    min_gaps: int = 10
    oob_max_share: float = 0.5
    forecast_margin: float = 0.15
    recent_gaps: int = 32
    """How many of the latest idle times the forecast reads (the memory bound)."""
    min_forecast_gaps: int = 5
    """Fewer recent idle times than this: no forecast, the fixed fallback."""

    name = "histogram (ATC'20)"

    def new_history(self) -> IdleHistory:
        return IdleHistory.empty(minute_edges(240), keep_recent=self.recent_gaps)

    def decide(
        self, history: IdleHistory, *, bound_s: float, load_s: float, now: float
    ) -> KeepAlivePlan:
        edges, counts = history.arrays()
        total = float(counts.sum())
        fallback = min(bound_s, float(edges[-1]))
        if total < self.min_gaps:
            return KeepAlivePlan(keep_alive_s=fallback, reason="histogram: too few idle times")
        if counts[-1] / total > self.oob_max_share:
            return self._forecast(history, fallback=fallback, bound_s=bound_s)
        inside = counts[:-1]
        cv = float(inside.std() / inside.mean()) if inside.mean() > 0 else 0.0
        if cv < self.cv_threshold:
            return KeepAlivePlan(keep_alive_s=fallback, reason="histogram: not representative")
        head = _percentile_edge(edges, counts, self.head_percentile, upper=False)
        tail = _percentile_edge(edges, counts, self.tail_percentile, upper=True)
        tail = min(tail * (1.0 + self.margin), bound_s)
        if head <= 0.0:
            return KeepAlivePlan(keep_alive_s=tail, reason="histogram: keep to tail")
        ready = head * (1.0 - self.margin)
        return KeepAlivePlan(
            keep_alive_s=0.0,
            prewarm_at_s=ready,
            prewarm_window_s=max(0.0, min(tail - ready, bound_s)),
            reason="histogram: pre-warm at head",
        )

    def _forecast(self, history: IdleHistory, *, fallback: float, bound_s: float) -> KeepAlivePlan:
        predicted = forecast_next(history.recent, min_points=self.min_forecast_gaps)
        if predicted is None or predicted <= 0.0:
            return KeepAlivePlan(keep_alive_s=fallback, reason="histogram: out of range")
        return KeepAlivePlan(
            keep_alive_s=0.0,
            prewarm_at_s=predicted * (1.0 - self.forecast_margin),
            prewarm_window_s=min(2.0 * self.forecast_margin * predicted, bound_s),
            reason="histogram: out of range, pre-warm at forecast",
        )


@dataclass(frozen=True, slots=True)
class Candidates:
    """Every plan :class:`AdaptivePolicy` weighs, with its predictions (flat arrays)."""

    keep_alive_s: NDArray[np.float64]
    prewarm_at_s: NDArray[np.float64]
    """NaN: no pre-warm."""
    prewarm_window_s: NDArray[np.float64]
    cost_s: NDArray[np.float64]
    """Predicted replica-seconds idle and loading per idle period."""
    cold_share: NDArray[np.float64]
    """Predicted cold starts per request."""


@dataclass(frozen=True, slots=True)
class AdaptivePolicy(KeepAlivePolicy):
    """zeroserve's policy: the cheapest plan that keeps cold starts under a target.

    The model's idle times are kept in a histogram with relative resolution (bins growing
    by sqrt(2) from 5 s to 4 h) whose counts halve every ``half_life_s``, so memory is
    bounded and a drifting pattern is followed within days. From it every plan of the form
    "keep K, then pre-warm to be ready at R and keep until E" (K, R, E on the bin edges and
    the bound; K alone when there is no pre-warm) is priced: expected replica-seconds idle
    plus loading per idle period, and expected cold starts per request (the history also
    counts requests, so a model whose idle periods separate thousands of requests may take
    a cold start where one called once per gap may not). The cheapest plan whose cold-start
    share is at most ``cold_start_target`` wins; if none meets it, the one with the fewest
    cold starts. While the history holds fewer than ``min_gaps`` (decayed) idle times the
    model gets a fixed ``fallback_keep_alive_s``.

    None of the parameters is fitted to a trace: the target is the user-facing promise
    (1 % of requests may wait for a load), the half-life one day (a daily cycle), the
    fallback the ~10 min that AWS Lambda keeps, ``min_gaps`` the fewest observations for
    which a 10 % tail means anything.
    """

    cold_start_target: float = 0.01
    half_life_s: float = 86400.0
    min_gaps: float = 10.0
    fallback_keep_alive_s: float = 600.0

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"adaptive {self.cold_start_target:.2%}"

    def new_history(self) -> IdleHistory:
        return IdleHistory.empty(geometric_edges(), half_life_s=self.half_life_s)

    def decide(
        self, history: IdleHistory, *, bound_s: float, load_s: float, now: float
    ) -> KeepAlivePlan:
        seen = history.decayed_to(now)
        if seen.gaps < self.min_gaps or seen.requests <= 0:
            return KeepAlivePlan(
                keep_alive_s=min(self.fallback_keep_alive_s, bound_s),
                reason="adaptive: history too short",
            )
        return self.choose(self.candidates(seen, bound_s=bound_s, load_s=load_s))

    def choose(self, candidates: Candidates) -> KeepAlivePlan:
        """The cheapest candidate meeting the target, else the one with the fewest cold
        starts (then the cheapest of those)."""
        return choose_for_targets(candidates, (self.cold_start_target,))[0]

    def candidates(self, history: IdleHistory, *, bound_s: float, load_s: float) -> Candidates:
        """Every plan priced on ``history`` (already decayed to the decision time).

        A gap inside a bin is taken at the bin's middle; one beyond the range is longer
        than any keep-alive. Times are the bin edges up to ``bound_s``, and the bound."""
        edges, counts = _split_at(history, bound_s)
        total = float(counts.sum())
        mids = np.append((edges[:-1] + edges[1:]) / 2.0, np.inf)[: len(counts)]
        finite = np.where(np.isfinite(mids), mids, 0.0)
        # Below edge j: how many gaps, and their summed length.
        below = np.concatenate(([0.0], np.cumsum(counts)))[: len(edges)]
        below_sum = np.concatenate(([0.0], np.cumsum(counts * finite)))[: len(edges)]
        usable = edges <= bound_s * (1 + 1e-9)
        x, n_below, s_below = edges[usable], below[usable], below_sum[usable]
        requests = history.requests
        # Keep-alive alone: idle for the gaps that end within K, K for the others.
        beyond = total - n_below
        keep_cost = s_below + x * beyond + load_s * beyond
        keep_cold = beyond
        # Keep K, be ready again at R, keep until E: the (K, R, E) grid with K <= R <= E.
        ia, ir, ie = _triples(len(x))
        k, r, e = x[ia], x[ir], x[ie]
        nk, nr, ne = n_below[ia], n_below[ir], n_below[ie]
        sk, sr, se = s_below[ia], s_below[ir], s_below[ie]
        impossible = (r - load_s < k) | (e - r > bound_s) | (r <= 0)
        pre_cost = (
            sk
            + k * (total - nk)
            + (se - sr - r * (ne - nr))
            + (e - r) * (total - ne)
            + load_s * ((total - nk) + (total - ne))
        )
        pre_cost[impossible] = np.inf
        pre_cold = (nr - nk) + (total - ne)
        pre_cold[impossible] = np.inf
        return Candidates(
            keep_alive_s=np.concatenate((x, k)),
            prewarm_at_s=np.concatenate((np.full(len(x), np.nan), r)),
            prewarm_window_s=np.concatenate((np.zeros(len(x)), e - r)),
            cost_s=np.concatenate((keep_cost, pre_cost)) / total,
            cold_share=np.concatenate((keep_cold, pre_cold)) / requests,
        )


def choose_for_targets(candidates: Candidates, targets: Sequence[float]) -> list[KeepAlivePlan]:
    """:meth:`AdaptivePolicy.choose` for several targets at once (the simulator's curve)."""
    share, cost = candidates.cold_share, candidates.cost_s
    fewest: int | None = None
    plans = []
    for target in targets:
        meets = share <= target
        if meets.any():
            best = int(np.argmin(np.where(meets, cost, np.inf)))
            reason = "adaptive: cheapest within target"
        else:
            if fewest is None:
                least = share.min()
                fewest = int(np.argmin(np.where(share <= least * (1 + 1e-9), cost, np.inf)))
            best = fewest
            reason = "adaptive: target out of reach, fewest cold starts"
        prewarm = float(candidates.prewarm_at_s[best])
        plans.append(
            KeepAlivePlan(
                keep_alive_s=float(candidates.keep_alive_s[best]),
                prewarm_at_s=None if math.isnan(prewarm) else prewarm,
                prewarm_window_s=float(candidates.prewarm_window_s[best]),
                reason=reason,
            )
        )
    return plans


def policy_for(name: PolicyName) -> KeepAlivePolicy:
    """The policy ``scaling.policy`` names, with its defaults."""
    if name == "adaptive":
        return AdaptivePolicy()
    return FixedPolicy()


@functools.lru_cache(maxsize=8)
def _triples(n: int) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.intp]]:
    """Index triples a <= i <= k below ``n`` (the same few sizes recur: cached)."""
    a, i, k = np.meshgrid(np.arange(n), np.arange(n), np.arange(n), indexing="ij")
    keep = (a <= i) & (i <= k)
    return a[keep], i[keep], k[keep]


def _split_at(
    history: IdleHistory, bound_s: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Edges with ``bound_s`` added (the bin it falls in split in proportion to width),
    and the counts, overflow last."""
    edges, counts = history.arrays()
    i = int(np.searchsorted(edges, bound_s)) - 1
    if bound_s >= edges[-1] or i < 0 or edges[i + 1] == bound_s:
        return edges, counts
    share = (bound_s - edges[i]) / (edges[i + 1] - edges[i])
    new_edges = np.concatenate((edges[: i + 1], [bound_s], edges[i + 1 :]))
    split = [counts[i] * share, counts[i] * (1 - share)]
    new_counts = np.concatenate((counts[:i], split, counts[i + 1 :]))
    return new_edges, new_counts


def _percentile_edge(
    edges: NDArray[np.float64], counts: NDArray[np.float64], q: float, *, upper: bool
) -> float:
    """The bin edge at percentile ``q`` of the counts: the lower edge of the bin holding it
    (``upper`` False) or its upper edge; the last edge for the overflow."""
    cumulative = np.cumsum(counts)
    i = int(np.searchsorted(cumulative, cumulative[-1] * q / 100.0, side="left"))
    i = min(i, len(edges) - 1)
    if upper:
        return float(edges[min(i + 1, len(edges) - 1)])
    return float(edges[i])


def _duration(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
