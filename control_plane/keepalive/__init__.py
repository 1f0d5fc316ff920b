"""Keep-alive and pre-warming: when an idle model unloads, and when one at zero comes back.

Pure decisions over a bounded, decaying histogram of each model's idle times
(``history``): the policies (``policies``: always-on, fixed, Knative's 60 s, the hybrid
histogram policy of Shahrad et al. (ATC'20), and zeroserve's adaptive policy), what a plan
costs on a known idle gap (``outcome``), the offline oracle, and the trace replay behind
``zeroserve simulate`` (``traces``, ``replay``). Nothing here does I/O or reads a clock:
callers pass ``now``, and the reaper and the simulator call the same functions.
"""

from control_plane.keepalive.history import IdleHistory
from control_plane.keepalive.plan import KeepAlivePlan
from control_plane.keepalive.policies import (
    AdaptivePolicy,
    AlwaysOnPolicy,
    FixedPolicy,
    HybridHistogramPolicy,
    KeepAlivePolicy,
    policy_for,
)

__all__ = [
    "AdaptivePolicy",
    "AlwaysOnPolicy",
    "FixedPolicy",
    "HybridHistogramPolicy",
    "IdleHistory",
    "KeepAlivePlan",
    "KeepAlivePolicy",
    "policy_for",
]
