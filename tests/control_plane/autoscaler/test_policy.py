from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

import control_plane.autoscaler as autoscaler
from control_plane.autoscaler import (
    AutoscalerSettings,
    Decision,
    PolicyState,
    Reason,
    ScalingContext,
    decide,
    initial_state,
)
from foundation.records import ScalingSpec

DEFAULTS = AutoscalerSettings()
# Ticks are 1 s apart in the scenarios; the loop ticks every couple of seconds in practice.
TICK_S = 1.0


def _spec(*, min_replicas: int = 0, max_replicas: int = 100, target: float = 10.0) -> ScalingSpec:
    return ScalingSpec(
        min_replicas=min_replicas, max_replicas=max_replicas, target_concurrency=target
    )


def _ctx(
    observed: float,
    ready: int,
    *,
    pending: int = 0,
    buffered: int = 0,
    min_replicas: int = 0,
    max_replicas: int = 100,
    target: float = 10.0,
) -> ScalingContext:
    return ScalingContext(
        spec=_spec(min_replicas=min_replicas, max_replicas=max_replicas, target=target),
        observed_concurrency=observed,
        ready_replicas=ready,
        pending_replicas=pending,
        buffered_requests=buffered,
    )


def _warm(settings: AutoscalerSettings, last_desired: int) -> PolicyState:
    """A state that has decided before, so it does not start in panic (see test_fresh_*)."""
    return dataclasses.replace(initial_state(settings), last_desired=last_desired)


@dataclass(frozen=True)
class Step:
    now: float
    ready: int
    decision: Decision
    state: PolicyState


def _simulate(
    timeline: Iterable[tuple[float, float]],
    *,
    ready: int,
    spec: ScalingSpec | None = None,
    settings: AutoscalerSettings = DEFAULTS,
    state: PolicyState | None = None,
    is_ready_following: bool = True,
) -> list[Step]:
    """Drive decide() over (now, concurrency) samples.

    With ``is_ready_following`` replicas are ready by the next tick (instant activation), else
    the ready count stays where it started.
    """
    spec = spec or _spec()
    state = state if state is not None else _warm(settings, ready)
    steps = []
    for now, concurrency in timeline:
        ctx = ScalingContext(spec=spec, observed_concurrency=concurrency, ready_replicas=ready)
        decision, state = decide(ctx, state, now, settings)
        steps.append(Step(now, ready, decision, state))
        if is_ready_following:
            ready = decision.desired_replicas
    return steps


def _constant(value: float, start: float, stop: float) -> list[tuple[float, float]]:
    count = round((stop - start) / TICK_S)
    return [(start + i * TICK_S, value) for i in range(count)]


# ---- one decision ----


@pytest.mark.parametrize(
    ("ctx", "expected", "reason"),
    [
        pytest.param(_ctx(20, ready=2), 2, Reason.STABLE, id="steady"),
        pytest.param(_ctx(21, ready=3), 3, Reason.STABLE, id="rounds-up"),
        pytest.param(_ctx(1, ready=2, target=0.5), 2, Reason.STABLE, id="fractional-target"),
        pytest.param(_ctx(0.01, ready=1), 1, Reason.STABLE, id="any-concurrency-wants-one"),
        pytest.param(_ctx(0, ready=1), 0, Reason.IDLE, id="idle-may-go-to-zero"),
        pytest.param(_ctx(0, ready=1, min_replicas=1), 1, Reason.BOUNDS, id="idle-stays-at-min"),
        pytest.param(_ctx(0, ready=0), 0, Reason.IDLE, id="idle-at-zero"),
        pytest.param(_ctx(5, ready=2, min_replicas=3), 3, Reason.BOUNDS, id="below-min"),
        pytest.param(_ctx(200, ready=5, max_replicas=5), 5, Reason.BOUNDS, id="max-clamp"),
        pytest.param(_ctx(3, ready=0, buffered=3), 1, Reason.SCALE_FROM_ZERO, id="from-zero"),
        pytest.param(
            _ctx(0, ready=0, buffered=2), 1, Reason.SCALE_FROM_ZERO, id="from-zero-before-metrics"
        ),
        pytest.param(
            _ctx(40, ready=0, buffered=40), 4, Reason.SCALE_FROM_ZERO, id="from-zero-burst"
        ),
        pytest.param(
            _ctx(40, ready=0, buffered=40, max_replicas=1),
            1,
            Reason.SCALE_FROM_ZERO,
            id="from-zero-max-one",
        ),
        pytest.param(
            _ctx(5, ready=0, pending=1, buffered=5),
            1,
            Reason.SCALE_FROM_ZERO,
            id="from-zero-while-activating",
        ),
        pytest.param(_ctx(0, ready=0, pending=1), 0, Reason.IDLE, id="activation-nobody-waits-for"),
        # In flight with nothing allocated is a stale report; only a buffered request wakes it.
        pytest.param(_ctx(5, ready=0), 0, Reason.IDLE, id="stays-at-zero"),
        pytest.param(_ctx(5, ready=0, min_replicas=1), 1, Reason.BOUNDS, id="zero-below-min"),
        pytest.param(_ctx(10, ready=8), 4, Reason.RATE_LIMIT, id="scale-down-halves"),
        pytest.param(
            _ctx(10, ready=2, pending=6), 4, Reason.RATE_LIMIT, id="scale-down-counts-pending"
        ),
        pytest.param(_ctx(30, ready=2), 3, Reason.STABLE, id="just-below-panic"),
        pytest.param(_ctx(40, ready=2), 4, Reason.PANIC, id="panic-at-threshold"),
        pytest.param(_ctx(30, ready=0, pending=2), 3, Reason.PANIC, id="panic-with-none-ready"),
        # Panic keeps the replicas being activated even when the burst wants fewer.
        pytest.param(_ctx(20, ready=1, pending=5), 6, Reason.PANIC, id="panic-keeps-pending"),
    ],
)
def test_one_decision(ctx: ScalingContext, expected: int, reason: Reason) -> None:
    state = _warm(DEFAULTS, ctx.ready_replicas + ctx.pending_replicas)
    decision, next_state = decide(ctx, state, 100.0, DEFAULTS)
    assert decision == Decision(expected, reason)
    assert next_state.last_desired == expected
    if reason is Reason.PANIC:
        assert next_state.is_panicking


@pytest.mark.parametrize(
    ("ctx", "changes", "expected", "reason"),
    [
        # max_up = ceil(1.5 x 4 allocated) = 6; the panic threshold is out of the way.
        pytest.param(
            _ctx(70, ready=1, pending=3),
            {"max_scale_up_rate": 1.5, "panic_threshold": 10.0},
            6,
            Reason.RATE_LIMIT,
            id="scale-up-rate",
        ),
        pytest.param(
            _ctx(10, ready=8),
            {"max_scale_down_rate": 4.0},
            2,
            Reason.RATE_LIMIT,
            id="scale-down-rate",
        ),
        pytest.param(
            _ctx(10, ready=8),
            {"max_scale_down_rate": 100.0},
            1,
            Reason.STABLE,
            id="scale-down-rate-not-binding",
        ),
        pytest.param(
            _ctx(30, ready=2), {"panic_threshold": 1.5}, 3, Reason.PANIC, id="lower-threshold"
        ),
        pytest.param(
            _ctx(10, ready=8),
            {"scale_down_delay_s": 30.0},
            4,
            Reason.RATE_LIMIT,
            id="delay-with-no-history",
        ),
    ],
)
def test_one_decision_with_settings(
    ctx: ScalingContext, changes: dict[str, Any], expected: int, reason: Reason
) -> None:
    settings = dataclasses.replace(DEFAULTS, **changes)
    state = _warm(settings, ctx.ready_replicas + ctx.pending_replicas)
    decision, _ = decide(ctx, state, 100.0, settings)
    assert decision == Decision(expected, reason)


@pytest.mark.parametrize(
    ("ready", "expected", "reason"),
    [
        pytest.param(0, 0, Reason.IDLE, id="none-ready"),
        pytest.param(1, 0, Reason.IDLE, id="one-ready"),
        pytest.param(3, 3, Reason.PANIC, id="several-ready-start-in-panic"),
    ],
)
def test_fresh_state_with_quiet_sample(ready: int, expected: int, reason: Reason) -> None:
    decision, state = decide(_ctx(0, ready=ready), initial_state(DEFAULTS), 0.0, DEFAULTS)
    assert decision == Decision(expected, reason)
    assert state.is_panicking is (reason is Reason.PANIC)


def test_window_float_error_does_not_add_a_replica() -> None:
    # Bucket means 0.1 and 1.1 average to 0.6000000000000001; 0.6 / 0.3 is 2 replicas, not 3.
    steps = _simulate(
        [(0.0, 0.1), (1.0, 1.1)], ready=2, spec=_spec(target=0.3), is_ready_following=False
    )
    assert steps[-1].decision == Decision(2, Reason.STABLE)


def test_decide_is_pure() -> None:
    ctx = _ctx(40, ready=2, pending=1, buffered=3)
    state = _warm(DEFAULTS, 3)
    first = decide(ctx, state, 12.5, DEFAULTS)
    assert decide(ctx, state, 12.5, DEFAULTS) == first
    assert state == _warm(DEFAULTS, 3)


def test_initial_state_windows_follow_settings() -> None:
    settings = AutoscalerSettings(
        stable_window_s=30.0, panic_window_s=3.0, scale_down_delay_s=10.0, bucket_s=0.5
    )
    state = initial_state(settings)
    assert (state.stable.window_s, state.stable.bucket_s) == (30.0, 0.5)
    assert (state.panic.window_s, state.panic.bucket_s) == (3.0, 0.5)
    assert state.delay is not None
    assert (state.delay.window_s, state.delay.bucket_s) == (10.0, 0.5)
    assert initial_state(DEFAULTS).delay is None
    assert not state.is_panicking
    assert state.last_desired is None


# ---- scenarios over a timeline ----


def test_steady_load_gives_stable_desired() -> None:
    noisy = [(now, 22.0 if i % 2 else 18.0) for i, (now, _) in enumerate(_constant(0, 0, 180))]
    steps = _simulate(noisy, ready=2)
    assert {step.decision for step in steps} == {Decision(2, Reason.STABLE)}
    assert not any(step.state.is_panicking for step in steps)


def test_burst_panics_then_holds_then_settles() -> None:
    burst_at, burst_end = 60.0, 90.0
    timeline = (
        _constant(20, 0, burst_at) + _constant(80, burst_at, burst_end) + _constant(20, 90, 300)
    )
    steps = _simulate(timeline, ready=2)

    before = [step for step in steps if step.now < burst_at]
    assert {step.decision for step in before} == {Decision(2, Reason.STABLE)}

    panicking = [step for step in steps if step.state.is_panicking]
    entered = panicking[0]
    assert burst_at <= entered.now < burst_at + DEFAULTS.panic_window_s
    assert entered.decision.reason is Reason.PANIC
    assert max(step.decision.desired_replicas for step in panicking) == 8

    # No scale-down while panicking, and the panic is one unbroken run.
    replicas = [step.decision.desired_replicas for step in panicking]
    assert replicas == sorted(replicas)
    assert [step.now for step in panicking] == [
        entered.now + i * TICK_S for i in range(len(panicking))
    ]

    # It ends exactly a stable window after the panic condition last held.
    last_over = panicking[-1].state.over_threshold_at
    assert last_over is not None
    exited = steps[steps.index(panicking[-1]) + 1]
    assert exited.now == last_over + DEFAULTS.stable_window_s
    assert not exited.state.is_panicking
    assert exited.decision.desired_replicas < 8

    # Then it scales down as the burst leaves the stable window, never more than halving.
    after = steps[steps.index(exited) :]
    for previous, step in zip(after, after[1:], strict=False):
        assert step.decision.desired_replicas <= previous.decision.desired_replicas
        assert step.decision.desired_replicas >= previous.decision.desired_replicas // 2
    assert steps[-1].decision == Decision(2, Reason.STABLE)


def test_burst_seen_at_panic_window_edge() -> None:
    # One high sample panics at once; a high panic want that only the stable window still
    # remembers after the burst does not re-enter panic (the panic window has moved on).
    timeline = _constant(20, 0, 60) + [(60.0, 200.0)] + _constant(20, 61, 200)
    steps = _simulate(timeline, ready=2, is_ready_following=False)
    panicking = [step.now for step in steps if step.state.is_panicking]
    assert panicking[0] == 60.0
    assert panicking[-1] == 60.0 + DEFAULTS.panic_window_s - 1 + DEFAULTS.stable_window_s - 1


@pytest.mark.parametrize(
    ("min_replicas", "expected_final", "final_reason"),
    [
        pytest.param(0, 0, Reason.IDLE, id="min-0-goes-to-zero"),
        pytest.param(1, 1, Reason.BOUNDS, id="min-1-stays"),
        pytest.param(2, 2, Reason.BOUNDS, id="min-2-stays"),
    ],
)
def test_idle(min_replicas: int, expected_final: int, final_reason: Reason) -> None:
    timeline = _constant(5, 0, 10) + _constant(0, 10, 100)
    steps = _simulate(timeline, ready=max(1, min_replicas), spec=_spec(min_replicas=min_replicas))
    by_time = {step.now: step.decision for step in steps}
    # The last concurrency, at 9.0, leaves the 60 s window at 69.0.
    assert by_time[68.0].desired_replicas == max(1, min_replicas)
    assert by_time[69.0] == Decision(expected_final, final_reason)
    assert steps[-1].decision == Decision(expected_final, final_reason)
    assert all(step.decision.desired_replicas >= min_replicas for step in steps)


def test_idle_from_several_replicas_halves_down_to_zero() -> None:
    steps = _simulate(_constant(0, 0, 5), ready=4)
    assert [step.decision for step in steps] == [
        Decision(2, Reason.RATE_LIMIT),
        Decision(1, Reason.RATE_LIMIT),
        Decision(0, Reason.IDLE),
        Decision(0, Reason.IDLE),
        Decision(0, Reason.IDLE),
    ]


def test_max_clamp_under_heavy_load() -> None:
    steps = _simulate(_constant(1000, 0, 30), ready=1, spec=_spec(max_replicas=3))
    assert {step.decision for step in steps} == {Decision(3, Reason.BOUNDS)}
    assert max(step.state.max_panic_replicas for step in steps) > 3


def test_scale_from_zero_then_serve_then_idle_again() -> None:
    spec = _spec()
    state = _warm(DEFAULTS, 0)

    def tick(now: float, observed: float, ready: int, pending: int, buffered: int) -> Decision:
        nonlocal state
        ctx = ScalingContext(spec, observed, ready, pending, buffered)
        decision, state = decide(ctx, state, now, DEFAULTS)
        return decision

    assert tick(0.0, 0, ready=0, pending=0, buffered=0) == Decision(0, Reason.IDLE)
    # An activator buffers a request and pokes the loop: the fast path, whatever the windows.
    assert tick(0.2, 0, ready=0, pending=0, buffered=1) == Decision(1, Reason.SCALE_FROM_ZERO)
    assert tick(1.0, 1, ready=0, pending=1, buffered=1) == Decision(1, Reason.SCALE_FROM_ZERO)
    assert tick(2.0, 1, ready=1, pending=0, buffered=0) == Decision(1, Reason.STABLE)
    assert tick(3.0, 0, ready=1, pending=0, buffered=0) == Decision(1, Reason.STABLE)
    # The reaper unloads the model while the stable window still remembers traffic: the
    # autoscaler must not load it again for nobody.
    assert tick(30.0, 0, ready=0, pending=0, buffered=0) == Decision(0, Reason.IDLE)
    assert tick(31.0, 0, ready=0, pending=0, buffered=0) == Decision(0, Reason.IDLE)
    # ... until somebody is waiting again.
    assert tick(32.0, 2, ready=0, pending=0, buffered=2) == Decision(1, Reason.SCALE_FROM_ZERO)


def test_scale_up_rate_limit() -> None:
    settings = AutoscalerSettings(max_scale_up_rate=2.0)
    steps = _simulate(_constant(160, 0, 8), ready=1, settings=settings)
    assert [step.decision.desired_replicas for step in steps] == [2, 4, 8, 16, 16, 16, 16, 16]
    assert steps[0].decision.reason is Reason.PANIC


def test_scale_down_rate_limit() -> None:
    steps = _simulate(_constant(0, 0, 6), ready=16)
    assert [step.decision.desired_replicas for step in steps] == [8, 4, 2, 1, 0, 0]


def test_scale_down_delay_holds_the_max_of_the_delay_window() -> None:
    fast = AutoscalerSettings(stable_window_s=6.0, panic_window_s=3.0)
    delayed = dataclasses.replace(fast, scale_down_delay_s=10.0)
    timeline = _constant(40, 0, 6) + _constant(0, 6, 40)
    undelayed_steps = _simulate(timeline, ready=4, settings=fast, is_ready_following=False)
    delayed_steps = _simulate(timeline, ready=4, settings=delayed, is_ready_following=False)

    undelayed = {step.now: step.decision.desired_replicas for step in undelayed_steps}
    assert undelayed[6.0] == 4
    assert undelayed[8.0] == 2
    for step in delayed_steps:
        held = max(
            replicas for now, replicas in undelayed.items() if step.now - 10 < now <= step.now
        )
        assert step.decision.desired_replicas == held, step.now
        if held > undelayed[step.now]:
            assert step.decision.reason is Reason.SCALE_DOWN_DELAY

    # Undelayed: 4 at 6.0 (five samples of 40 in the 6 s window), 3 at 7.0, then 2 (halving
    # from 4 ready is the floor). Each is held for 10 s.
    assert undelayed[7.0] == 3
    by_time = {step.now: step.decision for step in delayed_steps}
    assert by_time[15.0] == Decision(4, Reason.SCALE_DOWN_DELAY)
    assert by_time[16.0] == Decision(3, Reason.SCALE_DOWN_DELAY)
    assert by_time[17.0] == Decision(2, Reason.RATE_LIMIT)
    assert by_time[39.0] == Decision(2, Reason.RATE_LIMIT)


def test_fresh_state_starts_in_panic_and_holds_a_stable_window() -> None:
    steps = _simulate(_constant(0, 0, 70), ready=3, state=initial_state(DEFAULTS))
    by_time = {step.now: step.decision for step in steps}
    assert by_time[0.0] == Decision(3, Reason.PANIC)
    assert by_time[59.0] == Decision(3, Reason.PANIC)
    assert by_time[60.0] == Decision(1, Reason.RATE_LIMIT)
    assert by_time[61.0] == Decision(0, Reason.IDLE)


def test_panic_extends_while_the_condition_holds() -> None:
    # Ready stays at 1, so the burst stays over threshold: the panic does not end a stable
    # window after it began, only a stable window after the burst.
    timeline = _constant(30, 0, 100) + _constant(0, 100, 200)
    steps = _simulate(timeline, ready=1, is_ready_following=False)
    panicking = [step for step in steps if step.state.is_panicking]
    assert panicking[0].now == 0.0
    # The 6 s panic window still wants 2 (twice the one ready) until three samples of 30 are
    # left in it: the condition last holds at 102.0.
    last_over = panicking[-1].state.over_threshold_at
    assert last_over == 102.0
    assert panicking[-1].now == last_over + DEFAULTS.stable_window_s - 1
    assert {step.state.panic_since for step in panicking} == {0.0}


# ---- invariants over random timelines ----


_observation = st.tuples(
    st.floats(min_value=0.0, max_value=5.0),  # seconds since the previous tick
    st.floats(min_value=0.0, max_value=500.0),  # observed concurrency
    st.integers(min_value=0, max_value=20),  # ready
    st.integers(min_value=0, max_value=5),  # pending
    st.integers(min_value=0, max_value=10),  # buffered
)


@hypothesis_settings(max_examples=150, deadline=None)
@given(
    observations=st.lists(_observation, max_size=40),
    min_replicas=st.integers(min_value=0, max_value=3),
    extra=st.integers(min_value=0, max_value=10),
    delay_s=st.sampled_from([0.0, 5.0]),
)
def test_invariants(
    observations: list[tuple[float, float, int, int, int]],
    min_replicas: int,
    extra: int,
    delay_s: float,
) -> None:
    spec = _spec(min_replicas=min_replicas, max_replicas=max(1, min_replicas) + extra, target=8.0)
    settings = AutoscalerSettings(scale_down_delay_s=delay_s)
    state = initial_state(settings)
    now = 0.0
    for dt, observed, ready, pending, buffered in observations:
        now += dt
        ctx = ScalingContext(spec, observed, ready, pending, buffered)
        decision, next_state = decide(ctx, state, now, settings)
        desired = decision.desired_replicas
        assert spec.min_replicas <= desired <= spec.max_replicas
        if ready == 0 and buffered > 0:
            assert desired >= 1
            assert decision.reason is Reason.SCALE_FROM_ZERO
        elif ready + pending == 0:
            assert desired == spec.min_replicas
        if state.is_panicking and next_state.is_panicking:
            assert next_state.max_panic_replicas >= state.max_panic_replicas
        assert next_state.is_panicking is (next_state.over_threshold_at is not None)
        state = next_state


# ---- validation and surface ----


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"stable_window_s": 0.0}, "stable_window_s", id="stable-zero"),
        pytest.param({"stable_window_s": 3601.0}, "stable_window_s", id="stable-too-long"),
        pytest.param({"stable_window_s": math.nan}, "stable_window_s", id="stable-nan"),
        pytest.param({"stable_window_s": 5.0}, "panic_window_s", id="stable-below-panic"),
        pytest.param({"panic_window_s": 0.5}, "panic_window_s", id="panic-below-bucket"),
        pytest.param({"panic_window_s": 61.0}, "panic_window_s", id="panic-above-stable"),
        pytest.param({"panic_window_s": math.nan}, "panic_window_s", id="panic-nan"),
        pytest.param({"bucket_s": 0.0}, "bucket_s", id="bucket-zero"),
        pytest.param({"bucket_s": math.nan}, "bucket_s", id="bucket-nan"),
        pytest.param({"panic_threshold": 1.0}, "panic_threshold", id="threshold-low"),
        pytest.param({"panic_threshold": 10.5}, "panic_threshold", id="threshold-high"),
        pytest.param({"scale_down_delay_s": -1.0}, "scale_down_delay_s", id="delay-negative"),
        pytest.param({"scale_down_delay_s": 3601.0}, "scale_down_delay_s", id="delay-long"),
        pytest.param({"max_scale_up_rate": 1.0}, "max_scale_up_rate", id="up-rate-one"),
        pytest.param({"max_scale_up_rate": math.inf}, "max_scale_up_rate", id="up-rate-inf"),
        pytest.param({"max_scale_down_rate": 1.0}, "max_scale_down_rate", id="down-rate-one"),
        pytest.param({"max_scale_down_rate": math.nan}, "max_scale_down_rate", id="down-rate-nan"),
    ],
)
def test_invalid_settings_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AutoscalerSettings(**changes)


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"panic_threshold": 1.1, "max_scale_up_rate": 1.01}, id="low-edges"),
        pytest.param({"stable_window_s": 3600.0, "scale_down_delay_s": 3600.0}, id="high-edges"),
        pytest.param({"stable_window_s": 6.0, "panic_window_s": 6.0}, id="panic-equals-stable"),
        pytest.param({"panic_window_s": 1.0, "bucket_s": 1.0}, id="panic-equals-bucket"),
    ],
)
def test_edge_settings_are_accepted(changes: dict[str, Any]) -> None:
    AutoscalerSettings(**changes)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"spec": ScalingSpec(min_replicas=-1)}, "min_replicas", id="min-negative"),
        pytest.param({"spec": ScalingSpec(max_replicas=0)}, "max_replicas", id="max-zero"),
        pytest.param(
            {"spec": ScalingSpec(min_replicas=3, max_replicas=2)},
            "max_replicas",
            id="max-below-min",
        ),
        pytest.param(
            {"spec": ScalingSpec(target_concurrency=0.0)}, "target_concurrency", id="target-zero"
        ),
        pytest.param(
            {"spec": ScalingSpec(target_concurrency=math.nan)},
            "target_concurrency",
            id="target-nan",
        ),
        pytest.param({"observed_concurrency": -1.0}, "observed_concurrency", id="observed-neg"),
        pytest.param({"observed_concurrency": math.nan}, "observed_concurrency", id="observed-nan"),
        pytest.param({"ready_replicas": -1}, "ready_replicas", id="ready-negative"),
        pytest.param({"pending_replicas": -1}, "pending_replicas", id="pending-negative"),
        pytest.param({"buffered_requests": -1}, "buffered_requests", id="buffered-negative"),
    ],
)
def test_invalid_context_is_refused(kwargs: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"spec": ScalingSpec(), "observed_concurrency": 0.0}
    fields["ready_replicas"] = 0
    with pytest.raises(ValueError, match=message):
        ScalingContext(**{**fields, **kwargs})


def test_reasons_are_their_labels() -> None:
    assert [str(reason) for reason in Reason] == [
        "stable",
        "idle",
        "rate-limit",
        "panic",
        "scale-down-delay",
        "bounds",
        "scale-from-zero",
    ]


def test_package_exports() -> None:
    assert sorted(autoscaler.__all__) == [
        "AutoscalerSettings",
        "Decision",
        "PolicyState",
        "Reason",
        "ScalingContext",
        "WindowedAverage",
        "WindowedMax",
        "decide",
        "initial_state",
    ]
    for name in autoscaler.__all__:
        assert getattr(autoscaler, name) is not None
