"""How many replicas a model should have now: Knative's KPA decision, as a pure function.

``decide(ctx, state, now, settings)`` takes what the loop observed, the state the previous call
returned and the loop's monotonic clock, and returns a ``Decision`` with the next state. It does
no I/O and reads no clock, so a test drives it over any timeline (C8). The loop is the only code
that ticks, gathers the inputs and applies the result.

One decision, in order (``knative/serving: pkg/autoscaler/scaling/autoscaler.go``):

1. Record the observed concurrency in the stable (60 s) and panic (6 s) windows.
2. Want ``ceil(average / target_concurrency)`` replicas from each window.
3. Rate-limit both: at most ``max_scale_up_rate × n`` and at least ``n / max_scale_down_rate``,
   where ``n`` is the replicas allocated (ready + pending).
4. Panic when the panic-window want is at least ``panic_threshold × ready``. While panicking
   the decision is the largest seen since the panic began, so it never goes down; the panic
   ends one full stable window after the condition last held. A fresh state with more than
   one replica ready starts in panic, to hold the scale while the windows refill.
5. Hold scale-downs: the decision is the largest of the last ``scale_down_delay_s``.
6. Stay at zero: with nothing ready or pending and nothing buffered, ``0``.
7. Clamp to ``[min_replicas, max_replicas]``.
8. Scale-from-zero fast path: no ready replica and requests buffered means at least one,
   whatever the windows say.

Going to zero, with the reaper. ``decide`` wants ``0`` only when ``min_replicas`` is 0 and
every sample in the stable window was zero (any concurrency at all wants a replica), once the
rate limit has halved its way down and any scale-down delay has passed. ``0`` means "may go to
zero", not "unload now": the loop scales a model down to no fewer than one replica, and going
to zero is the reaper's job: it removes all of a model's replicas once no request has been in
flight or arrived for ``idle_timeout_s`` (``decide`` does not read it). With the defaults
(60 s window, 300 s idle timeout) the reaper's timer is what takes a model to zero. The two
cannot fight: once nothing is ready or pending, step 6 keeps the decision at ``0`` whatever
the windows remember, until an activator buffers a request and step 8 asks for a replica. So
an idle timeout shorter than the stable window unloads the model, and stale window history
does not load it again.

Where we differ from Knative, and why:

* Rate limits are based on allocated replicas (ready + pending), not ready ones: with a low
  ``max_scale_up_rate`` a ready-based cap could come out below the replicas already being
  activated and cancel loads in flight. The panic ratio still uses ready replicas, the
  capacity that can serve now.
* A panic that begins seeds its high-water mark with the allocated replicas, so "never scale
  down while panicking" also protects replicas that are still loading.
* There is no target utilisation percentage: ``target_concurrency`` is the target. Knative's
  default 70 % gives one steady client two GPUs.
* Step 6 is ours: Knative has no reaper to take the last replica behind the autoscaler's back.
* The scale-to-zero grace period and pod retention belong to the reaper (``idle_timeout_s``).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from control_plane.autoscaler.windows import WindowedAverage, WindowedMax
from foundation.records import ScalingSpec

__all__ = [
    "AutoscalerSettings",
    "Decision",
    "PolicyState",
    "Reason",
    "ScalingContext",
    "decide",
    "initial_state",
]

# Desired replicas are ceil(concurrency / target); window means carry float error (buckets
# of 0.1 and 1.1 average to 0.6000000000000001, which over a target of 0.3 would want 3), and a
# spurious extra replica can cost a whole GPU, so a ratio this close above an integer rounds
# down to it.
_RATIO_EPS = 1e-9
_MAX_WINDOW_S = 3600.0


def _require(is_ok: bool, message: str) -> None:
    if not is_ok:
        raise ValueError(message)


@dataclass(frozen=True, slots=True)
class AutoscalerSettings:
    """Tuning shared by every model's decisions; ranges follow Knative's ``config.validate``.

    Defaults are Knative's. Build the state with ``initial_state`` from the same settings that
    are later passed to ``decide``; after a settings change start again from ``initial_state``.
    """

    stable_window_s: float = 60.0
    """Averaging window for ordinary decisions, and how long a panic outlives its cause."""
    panic_window_s: float = 6.0
    """Short window that detects bursts; between bucket_s and stable_window_s."""
    panic_threshold: float = 2.0
    """Panic when the panic window wants this many times the ready replicas (1.1 to 10)."""
    scale_down_delay_s: float = 0.0
    """Hold the largest decision of this many seconds before scaling down; 0 disables."""
    max_scale_up_rate: float = 1000.0
    """At most this many times the allocated replicas per decision; above 1."""
    max_scale_down_rate: float = 2.0
    """At least the allocated replicas divided by this per decision; above 1."""
    bucket_s: float = 1.0
    """Granularity of the windows."""

    def __post_init__(self) -> None:
        # Each check asks "in range?" rather than "out of range?" so that NaN fails it.
        _require(
            0 < self.stable_window_s <= _MAX_WINDOW_S,
            f"stable_window_s must be in (0, {_MAX_WINDOW_S}], got {self.stable_window_s!r}",
        )
        _require(
            0 < self.bucket_s <= self.stable_window_s,
            f"bucket_s must be in (0, stable_window_s], got {self.bucket_s!r}",
        )
        _require(
            self.bucket_s <= self.panic_window_s <= self.stable_window_s,
            f"panic_window_s must be in [bucket_s, stable_window_s], got {self.panic_window_s!r}",
        )
        _require(
            1.1 <= self.panic_threshold <= 10.0,
            f"panic_threshold must be in [1.1, 10], got {self.panic_threshold!r}",
        )
        _require(
            0 <= self.scale_down_delay_s <= _MAX_WINDOW_S,
            f"scale_down_delay_s must be in [0, {_MAX_WINDOW_S}], got {self.scale_down_delay_s!r}",
        )
        _require(
            1 < self.max_scale_up_rate < math.inf,
            f"max_scale_up_rate must be a finite number above 1, got {self.max_scale_up_rate!r}",
        )
        _require(
            1 < self.max_scale_down_rate < math.inf,
            f"max_scale_down_rate must be a finite number above 1, "
            f"got {self.max_scale_down_rate!r}",
        )


@dataclass(frozen=True, slots=True)
class ScalingContext:
    """What the loop observed of one model at one tick."""

    spec: ScalingSpec
    observed_concurrency: float
    """Requests in flight plus requests buffered, now, summed over all activators."""
    ready_replicas: int
    """Replicas serving now."""
    pending_replicas: int = 0
    """Replicas being activated (placed, not yet ready)."""
    buffered_requests: int = 0
    """Requests waiting in activator buffers, summed over all activators."""

    def __post_init__(self) -> None:
        spec = self.spec
        _require(spec.min_replicas >= 0, f"min_replicas must be >= 0, got {spec.min_replicas}")
        _require(
            spec.max_replicas >= max(1, spec.min_replicas),
            f"max_replicas must be >= max(1, min_replicas), got {spec.max_replicas}",
        )
        _require(
            0 < spec.target_concurrency < math.inf,
            f"target_concurrency must be a positive number, got {spec.target_concurrency!r}",
        )
        _require(
            0 <= self.observed_concurrency < math.inf,
            f"observed_concurrency must be a number >= 0, got {self.observed_concurrency!r}",
        )
        _require(
            min(self.ready_replicas, self.pending_replicas, self.buffered_requests) >= 0,
            "ready_replicas, pending_replicas and buffered_requests must be >= 0",
        )


class Reason(enum.StrEnum):
    """Why a decision came out as it did: the last step that set it (see the module doc).

    ``panic`` and ``scale-from-zero`` name the mode even when an earlier step already gave the
    same number.
    """

    STABLE = "stable"
    """The stable-window average, unchanged by any later step."""
    IDLE = "idle"
    """No concurrency in the stable window, or nothing allocated and nobody waiting: zero."""
    RATE_LIMIT = "rate-limit"
    """max_scale_up_rate or max_scale_down_rate capped the stable-window want."""
    PANIC = "panic"
    """In panic mode: the panic window's want, and never lower than earlier in the panic."""
    SCALE_DOWN_DELAY = "scale-down-delay"
    """A larger decision from the last scale_down_delay_s is being held."""
    BOUNDS = "bounds"
    """Clamped to min_replicas or max_replicas."""
    SCALE_FROM_ZERO = "scale-from-zero"
    """No ready replica and requests buffered: the fast path asked for at least one."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The replicas one model should have.

    ``0`` means "may go to zero": the loop keeps one replica, and the reaper removes the
    model's replicas after ``idle_timeout_s`` without traffic.
    """

    desired_replicas: int
    reason: Reason


@dataclass(frozen=True, slots=True)
class PolicyState:
    """Everything ``decide`` remembers between calls for one model; replaced, never mutated."""

    stable: WindowedAverage
    """Observed concurrency over stable_window_s."""
    panic: WindowedAverage
    """Observed concurrency over panic_window_s."""
    delay: WindowedMax | None = None
    """Decisions over scale_down_delay_s; None when the delay is 0."""
    panic_since: float | None = None
    """When the current panic began; None when not panicking."""
    over_threshold_at: float | None = None
    """The last decision at which the panic condition held; None when not panicking."""
    max_panic_replicas: int = 0
    """The largest decision of the current panic; 0 when not panicking."""
    last_desired: int | None = None
    """The previous decision; None before the first one."""

    @property
    def is_panicking(self) -> bool:
        return self.panic_since is not None


def initial_state(settings: AutoscalerSettings) -> PolicyState:
    """The state for a model the autoscaler has not decided for yet (or after a restart)."""
    delay = (
        WindowedMax(settings.scale_down_delay_s, settings.bucket_s)
        if settings.scale_down_delay_s > 0
        else None
    )
    return PolicyState(
        stable=WindowedAverage(settings.stable_window_s, settings.bucket_s),
        panic=WindowedAverage(settings.panic_window_s, settings.bucket_s),
        delay=delay,
    )


def decide(
    ctx: ScalingContext, state: PolicyState, now: float, settings: AutoscalerSettings
) -> tuple[Decision, PolicyState]:
    """The replicas ``ctx``'s model should have at ``now``, and the state for the next call.

    ``now`` is monotonic seconds, non-decreasing across calls with the same state chain.
    Call it every tick, and at once when an activator buffers a request for a model with no
    ready replica (Knative's ``Poke``), so the fast path is not a tick late.
    """
    spec = ctx.spec
    stable = state.stable.record(ctx.observed_concurrency, now)
    panic = state.panic.record(ctx.observed_concurrency, now)
    stable_want = _replicas_for(stable.average(now), spec.target_concurrency)
    panic_want = _replicas_for(panic.average(now), spec.target_concurrency)

    # Knative treats zero replicas as one so that the limits and the panic ratio stay defined
    # (and a burst at zero can panic).
    ready = max(1, ctx.ready_replicas)
    allocated = ctx.ready_replicas + ctx.pending_replicas
    max_up = math.ceil(settings.max_scale_up_rate * max(1, allocated))
    max_down = math.floor(max(1, allocated) / settings.max_scale_down_rate)
    stable_replicas = _clamp(stable_want, max_down, max_up)
    panic_replicas = _clamp(panic_want, max_down, max_up)

    desired = stable_replicas
    if stable_replicas != stable_want:
        reason = Reason.RATE_LIMIT
    else:
        reason = Reason.IDLE if stable_want == 0 else Reason.STABLE

    # panic_threshold >= 1.1 makes "over threshold" imply wanting more than are ready.
    is_over = panic_want >= settings.panic_threshold * ready
    panic_since = state.panic_since
    over_at = state.over_threshold_at
    max_panic = state.max_panic_replicas
    # A fresh state with more than one replica ready starts in panic, as Knative's decider
    # does: after a control-plane restart or a lease failover the windows have lost their
    # history, and one quiet sample must not halve a busy model. Holding the current scale
    # for a stable window gives the windows time to refill.
    is_fresh_and_up = state.last_desired is None and ctx.ready_replicas > 1
    if panic_since is None and (is_over or is_fresh_and_up):
        panic_since, over_at, max_panic = now, now, allocated
    elif is_over:
        over_at = now
    elif over_at is not None and now - over_at >= settings.stable_window_s:
        panic_since, over_at, max_panic = None, None, 0

    if panic_since is not None:
        # The stable want can exceed the panic want when a burst has just ended; provision for
        # the larger, and never for less than earlier in this panic.
        max_panic = max(max_panic, stable_replicas, panic_replicas)
        desired, reason = max_panic, Reason.PANIC

    delay = state.delay
    if delay is not None:
        delay = delay.record(desired, now)
        held = int(delay.maximum(now))
        if held > desired:
            desired, reason = held, Reason.SCALE_DOWN_DELAY

    # At zero only the fast path brings a replica back. The reaper may have unloaded a model
    # whose stable window still remembers traffic (an idle timeout shorter than the window);
    # wanting a replica on that history would load it again for nobody.
    if allocated == 0 and ctx.buffered_requests == 0:
        desired, reason = 0, Reason.IDLE

    bounded = _clamp(desired, spec.min_replicas, spec.max_replicas)
    if bounded != desired:
        desired, reason = bounded, Reason.BOUNDS

    # Scale-from-zero fast path: somebody is waiting and nothing can serve them, so ask for a
    # replica whatever the windows say (they may not have seen the buffered requests yet).
    # max_replicas >= 1 is validated, so this cannot break the bounds.
    if ctx.ready_replicas == 0 and ctx.buffered_requests > 0:
        desired, reason = max(desired, 1), Reason.SCALE_FROM_ZERO

    next_state = PolicyState(
        stable=stable,
        panic=panic,
        delay=delay,
        panic_since=panic_since,
        over_threshold_at=over_at,
        max_panic_replicas=max_panic,
        last_desired=desired,
    )
    return Decision(desired, reason), next_state


def _replicas_for(concurrency: float, target: float) -> int:
    # Any concurrency at all wants a replica: only a window of zeros may go to zero.
    if concurrency <= 0:
        return 0
    return max(1, math.ceil(concurrency / target - _RATIO_EPS))


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))
