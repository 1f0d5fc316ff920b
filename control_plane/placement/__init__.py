"""Placement: which worker a replica goes to, and how replicas are taken away again.

``choose`` holds the decision, a pure function of a snapshot of the pool; ``placer`` reads the
store, calls it and applies what it decides (reserving room, starting workers, evicting,
loading), with the pool's workers and their reservations kept by ``workers``. Retiring a
replica, or putting it to sleep, is ``retire``; waking a sleeping one, or unloading it, is
``wake``. The rest of the control plane uses ``Placer``, its one entry point.
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
from control_plane.placement.placer import Placer, PlaceResult, WorkerApi

__all__ = [
    "Decision",
    "Evict",
    "NoCapacity",
    "Place",
    "PlaceResult",
    "Placer",
    "PoolView",
    "StartWorker",
    "Traffic",
    "WaitForStarts",
    "WorkerApi",
    "choose",
    "traffic_needed",
]
