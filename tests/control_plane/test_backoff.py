"""The activation backoff after failures that may pass: a pure decision on a given clock."""

from __future__ import annotations

import pytest

from control_plane.backoff import Backoff, BackoffPolicy, after_failure, retry_after_s, wait_s

POLICY = BackoffPolicy(initial_s=1.0, max_s=8.0)


def test_no_failure_waits_nothing():
    assert wait_s(None, 100.0) == 0.0


@pytest.mark.parametrize(
    ("failures", "expected_wait_s"),
    [
        pytest.param(1, 1.0, id="first"),
        pytest.param(2, 2.0, id="second-doubles"),
        pytest.param(3, 4.0, id="third"),
        pytest.param(4, 8.0, id="reaches-the-cap"),
        pytest.param(5, 8.0, id="stays-at-the-cap"),
        pytest.param(200, 8.0, id="many-failures-no-overflow"),
    ],
)
def test_each_failure_in_a_row_doubles_the_wait_up_to_the_cap(
    failures: int, expected_wait_s: float
):
    state = None
    now = 100.0
    for _ in range(failures):
        state = after_failure(state, now, POLICY, "store unreachable")
    assert state is not None
    assert state.failures == failures
    assert state.reason == "store unreachable"
    assert wait_s(state, now) == expected_wait_s


def test_the_wait_runs_out_with_the_clock():
    state = after_failure(None, 100.0, POLICY, "no capacity")
    assert wait_s(state, 100.5) == 0.5
    assert wait_s(state, 101.0) == 0.0
    assert wait_s(state, 250.0) == 0.0


@pytest.mark.parametrize(
    ("wait", "expected"),
    [
        pytest.param(0.01, 1, id="at-least-one"),
        pytest.param(1.0, 1, id="whole"),
        pytest.param(1.2, 2, id="rounds-up"),
    ],
)
def test_retry_after_is_whole_seconds_rounded_up(wait: float, expected: int):
    assert retry_after_s(wait) == expected


def test_the_record_is_a_value():
    state = Backoff(failures=1, not_before=5.0, reason="x")
    again = after_failure(state, 10.0, POLICY, "y")
    assert state == Backoff(failures=1, not_before=5.0, reason="x")
    assert again == Backoff(failures=2, not_before=12.0, reason="y")
