"""The out-of-range branch of the hybrid histogram policy: a forecast of the next idle time."""

from __future__ import annotations

import numpy as np
import pytest

from control_plane.keepalive import FixedPolicy, HybridHistogramPolicy, IdleHistory
from control_plane.keepalive.forecast import forecast_next
from control_plane.keepalive.replay import replay
from control_plane.keepalive.traces import bursts

H = 3600.0
LOAD_S = 20.0
BOUND_S = 4 * H


@pytest.mark.parametrize(
    ("series", "expected"),
    [
        pytest.param([5 * H] * 8, 5 * H, id="constant"),
        pytest.param([5 * H, 7 * H] * 5, 5 * H, id="period-2"),
        pytest.param([5 * H, 6 * H, 8 * H] * 4, 5 * H, id="period-3"),
        pytest.param([5 * H, 6 * H, 8 * H] * 4 + [5 * H], 6 * H, id="period-3-shifted"),
        pytest.param([5 * H + 600.0 * i for i in range(10)], 5 * H + 6000.0, id="trend"),
    ],
)
def test_a_regular_sequence_is_forecast_exactly(series, expected):
    assert forecast_next(series) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("series", [[], [5 * H], [5 * H, 7 * H, 5 * H, 7 * H]])
def test_too_few_points_give_no_forecast(series):
    assert forecast_next(series, min_points=5) is None


@pytest.mark.parametrize("seed", range(20))
def test_noise_gives_a_forecast_inside_the_clamp(seed):
    series = np.random.default_rng(seed).lognormal(np.log(6 * H), 1.0, 32)
    predicted = forecast_next(series.tolist())
    assert predicted is not None
    assert series.min() / 2 <= predicted <= 2 * series.max()


def _history(policy: HybridHistogramPolicy, gaps: list[float]) -> tuple[IdleHistory, float]:
    history, now = policy.new_history(), 0.0
    for gap in gaps:
        now += gap + 5.0
        history = history.observe(gap, ended_at=now - 5.0, requests=1.0, now=now)
    return history, now


@pytest.mark.parametrize(
    ("gaps", "prewarm_at", "window"),
    [
        # Beyond the 4-hour histogram, alternating 5 h and 7 h: the next is 5 h.
        pytest.param([5 * H, 7 * H] * 10, 0.85 * 5 * H, 0.30 * 5 * H, id="periodic"),
        pytest.param([6 * H] * 12, 0.85 * 6 * H, min(0.30 * 6 * H, BOUND_S), id="constant"),
    ],
)
def test_histogram_out_of_range_prewarms_around_the_forecast(gaps, prewarm_at, window):
    policy = HybridHistogramPolicy()
    history, now = _history(policy, gaps)
    plan = policy.decide(history, bound_s=BOUND_S, load_s=LOAD_S, now=now)
    assert plan.keep_alive_s == 0.0
    assert plan.prewarm_at_s == pytest.approx(prewarm_at, rel=1e-6)
    assert plan.prewarm_window_s == pytest.approx(window, rel=1e-6)
    assert "forecast" in plan.reason


def test_histogram_out_of_range_with_too_few_recent_gaps_keeps_the_fixed_fallback():
    # Ten idle times in all (enough for the histogram), but the policy remembers only four.
    policy = HybridHistogramPolicy(recent_gaps=4)
    history, now = _history(policy, [5 * H, 7 * H] * 5)
    assert len(history.recent) == 4
    plan = policy.decide(history, bound_s=BOUND_S, load_s=LOAD_S, now=now)
    assert plan.keep_alive_s == BOUND_S
    assert plan.prewarm_at_s is None
    assert plan.reason == "histogram: out of range"


def test_histogram_noise_beyond_the_range_gives_a_bounded_plan():
    gaps = np.random.default_rng(3).lognormal(np.log(8 * H), 0.8, 64)
    policy = HybridHistogramPolicy()
    history, now = _history(policy, gaps.tolist())
    assert len(history.recent) == policy.recent_gaps  # memory stays bounded
    plan = policy.decide(history, bound_s=BOUND_S, load_s=LOAD_S, now=now)
    recent = np.asarray(history.recent)
    assert plan.prewarm_at_s is not None
    assert 0.85 * recent.min() / 2 <= plan.prewarm_at_s <= 0.85 * 2 * recent.max()
    assert plan.prewarm_window_s <= BOUND_S
    assert IdleHistory.from_json(history.to_json()) == history


def test_replay_a_model_called_every_six_hours_is_prewarmed_not_kept():
    # A daily batch job every 6 h (beyond the 4-hour histogram), two weeks: the forecast
    # pre-warms it; the fixed fallback would keep it 4 h and still take every cold start.
    times = np.arange(1, 14 * 4) * 6 * H + np.random.default_rng(5).uniform(-60, 60, 55)
    trace = bursts(
        "batch", times, np.ones(len(times), np.int64), hold_s=5.0, horizon_s=14 * 86400.0
    )
    policies = [HybridHistogramPolicy(), FixedPolicy(BOUND_S)]
    hist, fixed = replay([trace], policies, load_s=LOAD_S, bound_s=BOUND_S, oracle=False)
    assert fixed.cold_starts == trace.requests  # every request waits under the fallback
    # Cold only the first request and until the histogram holds its ten idle times.
    assert hist.cold_starts <= HybridHistogramPolicy().min_gaps + 1
    assert hist.idle_s + hist.loading_s < (fixed.idle_s + fixed.loading_s) / 2
