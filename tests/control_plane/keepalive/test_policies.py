"""The keep-alive policies as pure functions: a history in, a plan out, the clock injected."""

from __future__ import annotations

import math

import numpy as np
import pytest

from control_plane.keepalive import (
    AdaptivePolicy,
    AlwaysOnPolicy,
    FixedPolicy,
    HybridHistogramPolicy,
    IdleHistory,
    KeepAlivePlan,
    KeepAlivePolicy,
    policy_for,
)
from control_plane.keepalive.plan import outcome

DAY = 86400.0
LOAD_S = 20.0
BOUND_S = 4 * 3600.0


def _learn(
    policy: KeepAlivePolicy,
    gaps: np.ndarray,
    *,
    requests_per_gap: float = 1.0,
    start: float = 0.0,
    history: IdleHistory | None = None,
) -> tuple[IdleHistory, float]:
    """Observe ``gaps`` one after the other (each followed by a 5 s request) from ``start``;
    returns the history and the clock at the end."""
    history = history if history is not None else policy.new_history()
    now = start
    for gap in gaps:
        now += float(gap) + 5.0
        history = history.observe(gap, ended_at=now - 5.0, requests=requests_per_gap, now=now)
    return history, now


def _cost(plan: KeepAlivePlan, gaps: np.ndarray) -> tuple[int, float]:
    """(cold starts, replica-seconds idle + loading) of ``plan`` on ``gaps``."""
    out = outcome(
        gaps,
        keep_alive_s=plan.keep_alive_s,
        prewarm_at_s=math.nan if plan.prewarm_at_s is None else plan.prewarm_at_s,
        prewarm_window_s=plan.prewarm_window_s,
        load_s=LOAD_S,
    )
    return int(out.cold.sum()), float(out.idle_s.sum() + out.loading_s.sum())


@pytest.mark.parametrize(
    ("bound_s", "expected"),
    [
        pytest.param(BOUND_S, 600.0, id="fallback-below-bound"),
        pytest.param(120.0, 120.0, id="bound-below-fallback"),
    ],
)
def test_adaptive_with_too_short_a_history_keeps_the_fallback(bound_s, expected):
    policy = AdaptivePolicy()
    history, now = _learn(policy, np.full(5, 900.0))
    plan = policy.decide(history, bound_s=bound_s, load_s=LOAD_S, now=now)
    assert plan.keep_alive_s == expected
    assert plan.prewarm_at_s is None
    assert "too short" in plan.reason


def test_adaptive_prewarms_a_periodic_model_instead_of_keeping_it():
    rng = np.random.default_rng(1)
    gaps = 1200.0 + rng.uniform(-30.0, 30.0, 200)  # every 20 minutes, give or take
    policy = AdaptivePolicy()
    history, now = _learn(policy, gaps)
    plan = policy.decide(history, bound_s=BOUND_S, load_s=LOAD_S, now=now)
    assert plan.prewarm_at_s is not None
    assert plan.keep_alive_s < 60.0
    future = 1200.0 + rng.uniform(-30.0, 30.0, 100)
    cold, cost = _cost(plan, future)
    assert cold <= 1  # the target is 1 % of requests
    fixed_cold, fixed_cost = _cost(KeepAlivePlan(keep_alive_s=1260.0), future)
    assert fixed_cold == 0
    assert cost < fixed_cost / 3


def test_adaptive_keeps_a_bursty_model_through_its_short_gaps_only():
    # Sessions: 95 % of gaps are 10-40 s inside a burst, 5 % are hours between bursts,
    # with 1 request per gap: keeping through the hours would cost far more than it saves.
    rng = np.random.default_rng(2)
    short = rng.uniform(10.0, 40.0, 950)
    long = rng.uniform(2 * 3600.0, 6 * 3600.0, 50)
    gaps = rng.permutation(np.concatenate((short, long)))
    policy = AdaptivePolicy(cold_start_target=0.10)
    history, now = _learn(policy, gaps)
    plan = policy.decide(history, bound_s=BOUND_S, load_s=LOAD_S, now=now)
    assert 40.0 <= plan.loaded_until_s < 2 * 3600.0
    cold, _ = _cost(plan, gaps)
    assert cold <= 0.10 * len(gaps)


def test_adaptive_is_bounded_by_idle_timeout():
    rng = np.random.default_rng(3)
    gaps = rng.uniform(1000.0, 3000.0, 300)
    policy = AdaptivePolicy(cold_start_target=0.0001)
    history, now = _learn(policy, gaps)
    plan = policy.decide(history, bound_s=600.0, load_s=LOAD_S, now=now)
    assert plan.keep_alive_s <= 600.0
    assert plan.prewarm_window_s <= 600.0


def test_adaptive_follows_drift_within_days():
    rng = np.random.default_rng(4)
    policy = AdaptivePolicy()
    # A week of 30-minute periods (336 gaps), then a week of calls every 5 minutes: the old
    # idle times, halved daily, are then too few to be worth covering.
    history, now = _learn(policy, 1800.0 + rng.uniform(-20, 20, 336))
    before = policy.decide(history, bound_s=BOUND_S, load_s=LOAD_S, now=now)
    assert before.prewarm_at_s is not None and before.prewarm_at_s > 1000.0
    history, now = _learn(policy, 300.0 + rng.uniform(-5, 5, 7 * 288), start=now, history=history)
    after = policy.decide(history, bound_s=BOUND_S, load_s=LOAD_S, now=now)
    assert after.loaded_until_s < 600.0
    cold, _ = _cost(after, 300.0 + rng.uniform(-5, 5, 100))
    assert cold <= 1


def test_a_clock_jumping_back_neither_inflates_nor_forgets():
    rng = np.random.default_rng(5)
    policy = AdaptivePolicy()
    history, now = _learn(policy, 1200.0 + rng.uniform(-30, 30, 100))
    earlier = now - 3 * DAY
    assert history.decayed_to(earlier) == history
    again = history.observe(600.0, ended_at=now, requests=1.0, now=earlier)
    assert again.gaps == pytest.approx(history.gaps + 1.0)
    assert policy.decide(history, bound_s=BOUND_S, load_s=LOAD_S, now=earlier) == policy.decide(
        history, bound_s=BOUND_S, load_s=LOAD_S, now=now
    )


def test_a_clock_jumping_far_ahead_falls_back_to_the_safe_plan():
    rng = np.random.default_rng(6)
    policy = AdaptivePolicy()
    history, now = _learn(policy, 1200.0 + rng.uniform(-30, 30, 100))
    plan = policy.decide(history, bound_s=BOUND_S, load_s=LOAD_S, now=now + 30 * DAY)
    assert "too short" in plan.reason
    assert plan.keep_alive_s == 600.0


def test_history_memory_is_bounded_and_round_trips():
    policy = AdaptivePolicy()
    history, now = _learn(policy, np.random.default_rng(7).exponential(600.0, 2000))
    small, _ = _learn(policy, np.full(3, 60.0))
    assert len(history.counts) == len(small.counts) < 40
    assert IdleHistory.from_json(history.to_json()) == history


def test_hybrid_prewarms_at_the_head_and_keeps_to_the_tail():
    rng = np.random.default_rng(8)
    policy = HybridHistogramPolicy()
    history, now = _learn(policy, 1800.0 + rng.uniform(-60, 60, 200))
    plan = policy.decide(history, bound_s=BOUND_S, load_s=LOAD_S, now=now)
    assert plan.keep_alive_s == 0.0
    assert plan.prewarm_at_s is not None
    assert 1500.0 <= plan.prewarm_at_s <= 1740.0  # the 5th percentile's bin, less 10 %
    assert 1860.0 <= plan.prewarm_at_s + plan.prewarm_window_s <= 2180.0


def test_hybrid_falls_back_when_the_histogram_is_not_representative():
    policy = HybridHistogramPolicy()
    flat = np.linspace(30.0, 4 * 3600.0 - 30.0, 240)  # one idle time per bin: CV 0
    history, now = _learn(policy, flat)
    plan = policy.decide(history, bound_s=BOUND_S, load_s=LOAD_S, now=now)
    assert plan.keep_alive_s == BOUND_S
    assert "not representative" in plan.reason


@pytest.mark.parametrize(
    ("policy", "keep"),
    [
        pytest.param(AlwaysOnPolicy(), math.inf, id="always-on"),
        pytest.param(FixedPolicy(), 300.0, id="fixed-bound"),
        pytest.param(FixedPolicy(60.0), 60.0, id="knative-60s"),
        pytest.param(FixedPolicy(3600.0), 300.0, id="fixed-capped-by-bound"),
    ],
)
def test_stateless_policies(policy, keep):
    plan = policy.decide(policy.new_history(), bound_s=300.0, load_s=LOAD_S, now=0.0)
    assert plan.keep_alive_s == keep
    assert plan.prewarm_at_s is None


def test_policy_for_names_the_registration_setting():
    assert isinstance(policy_for("adaptive"), AdaptivePolicy)
    assert policy_for("fixed") == FixedPolicy()
