"""Poll mode's decisions, table-driven, the clock an argument."""

from __future__ import annotations

import pytest

from data_plane.poll import Plan, PollState, RetryPolicy, Tracked, after, decide

RETRY = RetryPolicy(base_s=10.0, max_s=60.0)


@pytest.mark.parametrize(
    ("tracked", "scan", "now", "plan"),
    [
        pytest.param({}, {}, 0.0, Plan(), id="empty"),
        pytest.param({}, {"a": "s1", "b": "s2"}, 0.0, Plan(loads=("a", "b")), id="new-models"),
        pytest.param({"a": Tracked("s1")}, {"a": "s1"}, 0.0, Plan(), id="unchanged"),
        pytest.param({"a": Tracked("s1")}, {"a": "s2"}, 0.0, Plan(loads=("a",)), id="changed"),
        pytest.param({"a": Tracked("s1")}, {}, 0.0, Plan(unloads=("a",)), id="removed"),
        pytest.param({"a": Tracked("s1")}, {"a": None}, 0.0, Plan(), id="unreadable-is-left-alone"),
        pytest.param({}, {"a": None}, 0.0, Plan(), id="unreadable-new-waits"),
        pytest.param(
            {"a": Tracked("s1", failures=1, retry_at=10.0)},
            {"a": "s1"},
            9.9,
            Plan(),
            id="failed-waits-its-turn",
        ),
        pytest.param(
            {"a": Tracked("s1", failures=1, retry_at=10.0)},
            {"a": "s1"},
            10.0,
            Plan(loads=("a",)),
            id="failed-retried-when-due",
        ),
        pytest.param(
            {"a": Tracked("s1", failures=3, retry_at=100.0)},
            {"a": "s2"},
            0.0,
            Plan(loads=("a",)),
            id="failed-retried-at-once-when-changed",
        ),
        pytest.param(
            {"b": Tracked("s1"), "c": Tracked("s1")},
            {"a": "s1", "c": "s9"},
            0.0,
            Plan(loads=("a", "c"), unloads=("b",)),
            id="all-at-once",
        ),
    ],
)
def test_decide(tracked, scan, now, plan):
    assert decide(PollState(tracked), scan, now) == plan


@pytest.mark.parametrize(
    ("tracked", "scan", "loaded", "unloaded", "now", "expected"),
    [
        pytest.param({}, {"a": "s1"}, {"a": True}, [], 5.0, {"a": Tracked("s1")}, id="loaded"),
        pytest.param(
            {},
            {"a": "s1"},
            {"a": False},
            [],
            5.0,
            {"a": Tracked("s1", failures=1, retry_at=15.0)},
            id="first-failure-waits-the-base",
        ),
        pytest.param(
            {"a": Tracked("s1", failures=2, retry_at=20.0)},
            {"a": "s1"},
            {"a": False},
            [],
            20.0,
            {"a": Tracked("s1", failures=3, retry_at=60.0)},
            id="failures-double-the-wait",
        ),
        pytest.param(
            {"a": Tracked("s1", failures=5, retry_at=0.0)},
            {"a": "s1"},
            {"a": False},
            [],
            100.0,
            {"a": Tracked("s1", failures=6, retry_at=160.0)},
            id="up-to-the-bound",
        ),
        pytest.param(
            {"a": Tracked("s1", failures=5, retry_at=0.0)},
            {"a": "s2"},
            {"a": False},
            [],
            100.0,
            {"a": Tracked("s2", failures=1, retry_at=110.0)},
            id="a-change-starts-over",
        ),
        pytest.param(
            {"a": Tracked("s1", failures=1, retry_at=0.0)},
            {"a": "s1"},
            {"a": True},
            [],
            1.0,
            {"a": Tracked("s1")},
            id="a-retry-that-loads-clears",
        ),
        pytest.param(
            {"a": Tracked("s1"), "b": Tracked("s1")},
            {},
            {},
            ["a"],
            1.0,
            {"b": Tracked("s1")},
            id="a-failed-unload-stays-to-retry",
        ),
    ],
)
def test_after(tracked, scan, loaded, unloaded, now, expected):
    state = after(PollState(tracked), scan, loaded=loaded, unloaded=unloaded, now=now, retry=RETRY)
    assert dict(state.models) == expected


def test_a_round_trip_of_add_change_fail_retry_and_remove():
    state, now = PollState(), 0.0
    steps = [
        ({"a": "v1"}, Plan(loads=("a",)), {"a": True}),
        ({"a": "v1"}, Plan(), {}),
        ({"a": "v2"}, Plan(loads=("a",)), {"a": False}),  # a broken change: the old serves
        ({"a": "v2"}, Plan(), {}),  # not due yet
        ({"a": "v2"}, Plan(loads=("a",)), {"a": True}),  # due: retried, and it loads now
        ({}, Plan(unloads=("a",)), {}),
    ]
    for scan, expected, loaded in steps:
        plan = decide(state, scan, now)
        assert plan == expected
        state = after(state, scan, loaded=loaded, unloaded=plan.unloads, now=now, retry=RETRY)
        now += 6.0
    assert state == PollState({})
