"""Placement: which worker a new replica of a model goes to.

``choose`` holds the decision, a pure function of a snapshot of the pool; the placer reads
the store, calls it and applies what it decides.
"""

from control_plane.placement.choose import (
    Decision,
    Evict,
    NoCapacity,
    Place,
    PoolView,
    StartWorker,
    Traffic,
    WaitForStarts,
    choose,
    traffic_needed,
)

__all__ = [
    "Decision",
    "Evict",
    "NoCapacity",
    "Place",
    "PoolView",
    "StartWorker",
    "Traffic",
    "WaitForStarts",
    "choose",
    "traffic_needed",
]
