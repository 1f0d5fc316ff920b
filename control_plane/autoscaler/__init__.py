"""The autoscaler: how many replicas each model wants, decided KPA-style from observed concurrency.

``policy`` holds the decision, a pure function of what was observed, the previous state and the
clock; ``windows`` holds the time-bucketed stable and panic windows it averages over. The loop
that ticks, gathers traffic reports and applies decisions lives apart from both, and is the only
part that does I/O or reads the clock. The last replica of an idle model is the reaper's to
remove, not the autoscaler's (see ``policy``).
"""

from control_plane.autoscaler.policy import (
    AutoscalerSettings,
    Decision,
    PolicyState,
    Reason,
    ScalingContext,
    decide,
    initial_state,
)
from control_plane.autoscaler.windows import WindowedAverage, WindowedMax

__all__ = [
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
