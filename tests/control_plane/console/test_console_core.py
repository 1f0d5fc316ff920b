"""The console's pure parts: sessions and CSRF tokens, request windows, phase bars."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry

from activator.metrics import ActivatorMetrics
from control_plane.api.console.session import SessionKeys
from control_plane.api.console.stats import RequestHistory, quantile, read_counts
from control_plane.api.console.timeline import Bar, bars


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---- sessions ----


def test_a_session_is_valid_until_it_expires_and_only_under_its_token():
    keys = SessionKeys("token-a", lifetime_s=60)
    cookie = keys.issue(now=1000.0)
    assert keys.is_valid(cookie, now=1059.0)
    assert not keys.is_valid(cookie, now=1061.0)
    assert not SessionKeys("token-b", lifetime_s=60).is_valid(cookie, now=1000.0)
    expiry, nonce, mac = cookie.split(".")
    assert not keys.is_valid(f"{int(expiry) + 3600}.{nonce}.{mac}", now=1000.0)
    assert not keys.is_valid(None, now=1000.0)
    assert not keys.is_valid("garbage", now=1000.0)
    assert keys.is_admin_token("token-a") and not keys.is_admin_token("token-")


def test_a_csrf_token_belongs_to_one_session():
    keys = SessionKeys("token-a", lifetime_s=60)
    first, second = keys.issue(now=0.0), keys.issue(now=0.0)
    assert first != second
    token = keys.csrf_token(first)
    assert keys.is_csrf_valid(first, token)
    assert not keys.is_csrf_valid(second, token)
    assert not keys.is_csrf_valid(first, None)
    assert not keys.is_csrf_valid(None, token)


# ---- request windows ----


def test_quantiles_interpolate_within_their_bucket():
    buckets = ((0.1, 50.0), (1.0, 100.0), (math.inf, 100.0))
    assert quantile(0.5, buckets) == pytest.approx(0.1)
    assert quantile(0.75, buckets) == pytest.approx(0.55)
    assert quantile(0.5, ((0.1, 0.0), (math.inf, 0.0))) is None
    assert quantile(0.99, ((0.1, 1.0), (math.inf, 10.0))) == 0.1  # in +Inf: the last bound


def test_windows_count_what_the_activator_answered_since_their_start():
    registry = CollectorRegistry()
    metrics = ActivatorMetrics(registry)
    clock = FakeClock()
    history = RequestHistory(registry, period_s=60, span_s=3600, clock=clock)
    for _ in range(3):
        metrics.request_finished(model="m", status=200, duration_s=0.02)
    metrics.request_finished(model="m", status=503, duration_s=5.0)
    clock.now += 60
    history.sample()
    metrics.request_finished(model="m", status=200, duration_s=0.02)
    clock.now += 60

    whole = history.windows(3600)["m"]
    assert (whole.requests, whole.errors, whole.covered_s) == (5, 1, 120)
    assert whole.rate_per_s == pytest.approx(5 / 120)
    assert whole.p50_s is not None and whole.p50_s <= 0.025
    assert whole.p99_s is not None and whole.p99_s >= 2.5

    # A window starts at the newest sample at or before its start: here the one 60 s ago.
    recent = history.windows(60)["m"]
    assert (recent.requests, recent.errors, recent.covered_s) == (1, 0, 60)
    assert read_counts(CollectorRegistry()) == {}


# ---- phase bars ----


def test_a_finished_timeline_has_one_bar_per_phase_ending_at_its_mark():
    timeline = {
        "outcome": "ready",
        "phases": [
            {"phase": "queued", "at_s": 0.0},
            {"phase": "worker_ready", "at_s": 1.0},
            {"phase": "fetched", "at_s": 3.0},
            {"phase": "engine_built", "at_s": 7.0},
            {"phase": "ready", "at_s": 7.5},
        ],
        "durations_s": {"total": 7.5},
    }
    assert bars(timeline) == [
        Bar("worker start", 0.0, 1.0),
        Bar("fetch", 1.0, 3.0),
        Bar("engine build", 3.0, 7.0),
        Bar("publish", 7.0, 7.5),
    ]


@pytest.mark.parametrize(
    ("timeline", "now_s", "last"),
    [
        pytest.param(
            {"outcome": "running", "phases": [{"phase": "queued", "at_s": 0.0}]},
            2.0,
            Bar("placement", 0.0, 2.0),
            id="running-queued",
        ),
        pytest.param(
            {
                "outcome": "failed",
                "phases": [{"phase": "queued", "at_s": 0.0}, {"phase": "loading", "at_s": 1.0}],
                "durations_s": {"total": 4.0},
            },
            None,
            Bar("load", 1.0, 4.0),
            id="failed-while-loading",
        ),
    ],
)
def test_a_running_or_failed_timeline_has_bars_from_each_phase_begun(timeline, now_s, last):
    assert bars(timeline, now_s=now_s)[-1] == last
