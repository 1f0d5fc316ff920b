"""Placement: which worker a replica goes to, and how replicas are taken away again.

``choose`` holds the decision, a pure function of a snapshot of the pool; ``placer`` reads the
store, calls it and applies what it decides (reserving room, starting workers, evicting,
loading), with the pool's workers and their reservations kept by ``workers``. Retiring a
replica, or putting it to sleep, is ``retire``; waking a sleeping one, or unloading it, is
``wake``. ``Placer`` serves one pool; ``pools.PoolPlacers``, the entry point the rest of
the control plane uses, holds one per configured pool and sends each model to the pool
``routing`` picks from its backend.
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
from control_plane.placement.placer import PlaceProgress, Placer, PlaceResult, WorkerApi
from control_plane.placement.pools import PoolPlacers
from control_plane.placement.routing import model_backend, pool_for

__all__ = [
    "Decision",
    "Evict",
    "NoCapacity",
    "Place",
    "PlaceProgress",
    "PlaceResult",
    "Placer",
    "PoolPlacers",
    "PoolView",
    "StartWorker",
    "Traffic",
    "WaitForStarts",
    "WorkerApi",
    "choose",
    "model_backend",
    "pool_for",
    "traffic_needed",
]
