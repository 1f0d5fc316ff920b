"""What a plan costs on idle gaps of known length, computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from control_plane.keepalive.plan import (
    KeepAlivePlan,
    engine_state,
    oracle_outcome,
    outcome,
    wants_loaded,
)

LOAD = 20.0


@pytest.mark.parametrize(
    ("gap", "keep", "ready", "window", "cold", "latency", "idle", "loading"),
    [
        pytest.param(50, 60, math.nan, 0, False, 0, 50, 0, id="within-keep-alive"),
        pytest.param(100, 60, math.nan, 0, True, 20, 60, 20, id="after-keep-alive"),
        pytest.param(100, 10, 300, 100, True, 20, 10, 20, id="before-prewarm-load"),
        pytest.param(290, 10, 300, 100, True, 10, 10, 20, id="while-prewarm-loads"),
        pytest.param(350, 10, 300, 100, False, 0, 60, 20, id="prewarmed"),
        pytest.param(450, 10, 300, 100, True, 20, 110, 40, id="after-prewarm-window"),
        pytest.param(350, 100, 110, 300, False, 0, 350, 0, id="prewarm-merges-with-keep"),
    ],
)
def test_outcome_by_hand(gap, keep, ready, window, cold, latency, idle, loading):
    out = outcome(
        np.array([gap], float),
        keep_alive_s=keep,
        prewarm_at_s=ready,
        prewarm_window_s=window,
        load_s=LOAD,
    )
    assert bool(out.cold[0]) is cold
    assert out.added_latency_s[0] == pytest.approx(latency)
    assert out.idle_s[0] == pytest.approx(idle)
    assert out.loading_s[0] == pytest.approx(loading)


def test_always_on_idles_through_every_gap():
    out = outcome(
        np.array([5.0, 5000.0]),
        keep_alive_s=math.inf,
        prewarm_at_s=math.nan,
        prewarm_window_s=0.0,
        load_s=LOAD,
    )
    assert not out.cold.any()
    assert out.idle_s.tolist() == [5.0, 5000.0]


def test_oracle_keeps_short_gaps_and_reloads_on_time():
    out = oracle_outcome(np.array([10.0, 500.0]), load_s=LOAD)
    assert not out.cold.any()
    assert out.idle_s.tolist() == [10.0, 0.0]
    assert out.loading_s.tolist() == [0.0, LOAD]


@pytest.mark.parametrize(
    ("idle", "expected"),
    [(5, True), (15, False), (279, False), (280, True), (399, True), (400, False)],
)
def test_wants_loaded_is_the_plan_as_the_reaper_applies_it(idle, expected):
    plan = KeepAlivePlan(keep_alive_s=10.0, prewarm_at_s=300.0, prewarm_window_s=100.0)
    assert wants_loaded(plan, idle, LOAD) is expected


@pytest.mark.parametrize(
    ("idle", "sleep_after", "expected"),
    [
        # An engine that cannot sleep follows the plan: loaded, unloaded, pre-warmed.
        (5, 0, "loaded"),
        (15, 0, "unloaded"),
        (290, 0, "loaded"),
        (400, 0, "unloaded"),
        # One that can sleeps where the plan would unload, instead of unloading...
        (5, 1800, "loaded"),
        (15, 1800, "sleeping"),
        (400, 1800, "sleeping"),
        # ...stays loaded where the plan wants it (a pre-warm window)...
        (290, 1800, "loaded"),
        # ...and sleeps at sleep_after_s even where the plan would keep it.
        (5, 4, "sleeping"),
        (290, 100, "sleeping"),
    ],
)
def test_engine_state_moves_llm_engines_between_loaded_sleeping_and_unloaded(
    idle, sleep_after, expected
):
    plan = KeepAlivePlan(keep_alive_s=10.0, prewarm_at_s=300.0, prewarm_window_s=100.0)
    assert engine_state(plan, idle, LOAD, sleep_after_s=sleep_after) == expected
