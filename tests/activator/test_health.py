"""When a worker gets a liveness probe, and what its answer does: pure decisions."""

from __future__ import annotations

import pytest

from activator.health import (
    StallPolicy,
    Verdict,
    WorkerHealth,
    WorkerSignals,
    after_probe,
    decide_probe,
)

POLICY = StallPolicy(stall_after_s=1.0, probe_interval_s=2.0)
NOW = 100.0


@pytest.mark.parametrize(
    ("signals", "health", "is_due"),
    [
        pytest.param(WorkerSignals(0, 0.0), WorkerHealth(), False, id="idle"),
        pytest.param(WorkerSignals(3, NOW - 0.5), WorkerHealth(), False, id="waiting-briefly"),
        pytest.param(WorkerSignals(1, NOW - 1.0), WorkerHealth(), True, id="stalled"),
        pytest.param(
            WorkerSignals(1, NOW - 5.0),
            WorkerHealth(last_probe_at=NOW - 1.0),
            False,
            id="stalled-probed-lately",
        ),
        pytest.param(
            WorkerSignals(1, NOW - 5.0),
            WorkerHealth(last_probe_at=NOW - 2.0),
            True,
            id="stalled-probed-a-while-ago",
        ),
        pytest.param(None, WorkerHealth(), False, id="not-routed"),
        pytest.param(None, WorkerHealth(is_suspended=True), True, id="suspended-never-probed"),
        pytest.param(
            None,
            WorkerHealth(is_suspended=True, last_probe_at=NOW - 1.9),
            False,
            id="suspended-probed-lately",
        ),
        pytest.param(
            None,
            WorkerHealth(is_suspended=True, last_probe_at=NOW - 2.0),
            True,
            id="suspended-probed-a-while-ago",
        ),
    ],
)
def test_decide_probe(signals: WorkerSignals | None, health: WorkerHealth, is_due: bool) -> None:
    due, after = decide_probe(signals, health, POLICY, NOW)
    assert due is is_due
    if is_due:
        assert after == WorkerHealth(is_suspended=health.is_suspended, last_probe_at=NOW)
    else:
        assert after == health


@pytest.mark.parametrize(
    ("is_suspended", "is_live", "verdict"),
    [
        pytest.param(False, True, Verdict.NONE, id="live-stays"),
        pytest.param(False, False, Verdict.SUSPEND, id="dead-leaves"),
        pytest.param(True, False, Verdict.NONE, id="still-dead-stays-out"),
        pytest.param(True, True, Verdict.RESUME, id="back"),
    ],
)
def test_after_probe(is_suspended: bool, is_live: bool, verdict: Verdict) -> None:
    health = WorkerHealth(is_suspended=is_suspended, last_probe_at=NOW)
    got, after = after_probe(health, is_live=is_live)
    assert got is verdict
    expected_suspended = verdict is Verdict.SUSPEND or (is_suspended and verdict is Verdict.NONE)
    assert after == WorkerHealth(is_suspended=expected_suspended, last_probe_at=NOW)
