"""Where a new replica goes: the placer's choice, as a pure function.

``choose(view, model)`` takes a snapshot of the pool (its workers, the replicas on them, the
loads, retirements and worker starts under way, the traffic of replicas it may evict) and the
model to place, and returns a decision. It does no I/O, so a table of snapshots tests every
rule. The placer reads the store first, calls it under its lock and applies the decision:
it reserves room, starts a worker or evicts, and loads. The rules compare timestamps and
never measure a duration, so no clock is needed.

The rules, in order:

1. Refuse a model whose device the pool lacks (``cpu`` models run on any device), or one
   larger than a worker's memory budget.
2. A candidate is a ready worker of the pool, of the model's device (any, for a ``cpu``
   model), not being stopped, with no replica of the model (placed, loading or retiring),
   and with room: fewer replicas than ``max_models_per_worker`` (placed, asleep and loading
   ones count), and the model fits its memory budget (0 = unbounded) beside them. A replica
   already being retired no longer takes room.
3. Among candidates prefer a worker that loaded the model before (its node cache and engine
   cache hold it), then the fullest one (packing leaves other workers empty, so they can be
   reaped or kept warm), then the oldest.
4. With no candidate, start a worker if the pool may grow (workers and starts under way
   below ``max_workers``).
5. Else unload the longest-asleep replica whose unload makes room: nobody is using it, and
   keeping it over a loaded one saves no cold start.
6. Else evict the least recently used idle replica whose eviction makes room: of another
   model, not one of its model's last ``min_replicas``, not already retiring, and with no
   request in flight. Its last use is its model's latest request or its placement, whichever
   came later.
7. Else wait for the workers starting, if any: one of them may have room once it is up.
8. Else there is no capacity.

Rule 6 needs the traffic of the replicas it may evict, which costs a store read per model:
``traffic_needed`` says which models those are (none unless rules 1-5 found nothing), and a
model missing from ``PoolView.traffic`` is never evicted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from control_plane.backends.base import PoolSpec
from foundation.records import ModelRecord, Placement, WorkerRecord, WorkerState

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


@dataclass(frozen=True, slots=True)
class Traffic:
    """What the activators report of one model, summed over them."""

    in_flight: int = 0
    last_request_at: float = 0.0
    """Wall-clock seconds since the epoch of the latest arrival; 0 when none was reported."""


@dataclass(frozen=True, slots=True)
class PoolView:
    """The pool as the placer saw it just before choosing.

    Replicas come from the store, loads, retirements, unloads and stops under way from the
    placer's own bookkeeping, and workers from the backend.
    """

    pool: PoolSpec
    workers: tuple[WorkerRecord, ...] = ()
    """The pool's workers, in any state."""
    starting: int = 0
    """Worker starts under way (not among ``workers`` yet)."""
    placements: tuple[Placement, ...] = ()
    """Every placed (serving) replica, of every model."""
    sleeping: tuple[Placement, ...] = ()
    """Every sleeping replica; each holds its worker's room like a placed one."""
    models: Mapping[str, ModelRecord] = field(default_factory=dict)
    """Registered models by name: the memory a replica takes, ``min_replicas``."""
    reserved: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Worker id -> model -> bytes reserved for a load under way."""
    retiring: frozenset[tuple[str, str]] = frozenset()
    """(model, worker id) of replicas being retired."""
    unloading: frozenset[tuple[str, str]] = frozenset()
    """(model, worker id) of sleeping replicas being unloaded."""
    stopping: frozenset[str] = frozenset()
    """Ids of workers being stopped."""
    warm: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Worker id -> models it has loaded before."""
    traffic: Mapping[str, Traffic] = field(default_factory=dict)
    """Model -> its traffic, for the models ``traffic_needed`` names."""
    max_models_per_worker: int = 0
    """Replicas one worker may hold; 0 = unbounded."""


@dataclass(frozen=True, slots=True)
class Place:
    """Load the model on ``worker``, which has room for it."""

    worker: WorkerRecord


@dataclass(frozen=True, slots=True)
class Evict:
    """Take ``victim`` off ``worker`` (unload it when it sleeps, else retire it), then load
    the model there."""

    worker: WorkerRecord
    victim: Placement
    is_sleeping: bool


@dataclass(frozen=True, slots=True)
class StartWorker:
    """Start a worker for the model: no worker has room and the pool may grow."""


@dataclass(frozen=True, slots=True)
class WaitForStarts:
    """No room and the pool is full, but workers are starting: choose again once one is up."""


@dataclass(frozen=True, slots=True)
class NoCapacity:
    """No worker can take the model, now or by evicting."""

    reason: str


Decision = Place | Evict | StartWorker | WaitForStarts | NoCapacity


def choose(view: PoolView, model: ModelRecord) -> Decision:
    """Where one new replica of ``model`` goes (the rules are in the module docstring)."""
    scene = _Scene(view, model)
    decision = scene.decide_without_traffic()
    if decision is not None:
        return decision
    victim = scene.idle_victim()
    if victim is not None:
        return Evict(worker=scene.open[victim.worker_id], victim=victim, is_sleeping=False)
    if view.starting:
        return WaitForStarts()
    return NoCapacity(
        reason=(
            f"all {len(scene.workers)} {model.resources.device} workers are full, "
            f"the pool is at max_workers={view.pool.max_workers} "
            "and no idle replica can be evicted"
        )
    )


def traffic_needed(view: PoolView, model: ModelRecord) -> frozenset[str]:
    """The models whose traffic ``choose`` needs to pick a replica to evict; empty when it
    decides without evicting a placed replica."""
    scene = _Scene(view, model)
    if scene.decide_without_traffic() is not None:
        return frozenset()
    return frozenset(p.model for p in scene.evictable())


class _Scene:
    """What the rules read, derived once per call."""

    def __init__(self, view: PoolView, model: ModelRecord) -> None:
        self.view = view
        self.model = model
        device = model.resources.device
        self.workers = [
            w
            for w in view.workers
            if w.state is WorkerState.READY
            and (device == "cpu" or w.device == device)
            and w.id not in view.stopping
        ]
        hosting = {p.worker_id for p in view.placements if p.model == model.name}
        hosting |= {w for w, models in view.reserved.items() if model.name in models}
        hosting |= {w for (m, w) in view.retiring if m == model.name}
        self.open = {w.id: w for w in self.workers if w.id not in hosting}
        """Workers that may take the model, room permitting."""
        # Sleeping replicas hold their worker's memory too.
        self.held = [*view.placements, *view.sleeping]
        self.memory = {name: r.resources.memory_bytes for name, r in view.models.items()}
        self.memory[model.name] = model.resources.memory_bytes

    def decide_without_traffic(self) -> Decision | None:
        """Rules 1 to 5; None when the choice comes to evicting a placed replica."""
        pool, model = self.view.pool, self.model
        device, need = model.resources.device, model.resources.memory_bytes
        if device != "cpu" and device != pool.device:
            return NoCapacity(reason=f"pool '{pool.name}' has no {device} workers")
        if pool.memory_bytes and need > pool.memory_bytes:
            return NoCapacity(reason=f"it needs {need} bytes and a worker has {pool.memory_bytes}")
        candidates = [w for w in self.open.values() if self.fits(w, evicting=None)]
        if candidates:
            return Place(worker=min(candidates, key=self.rank))
        if len(self.view.workers) + self.view.starting < pool.max_workers:
            return StartWorker()
        sleeper = self.sleeping_victim()
        if sleeper is not None:
            return Evict(worker=self.open[sleeper.worker_id], victim=sleeper, is_sleeping=True)
        return None

    def fits(self, worker: WorkerRecord, *, evicting: Placement | None) -> bool:
        here = [p for p in self.held if p.worker_id == worker.id and p != evicting]
        reserved = self.view.reserved.get(worker.id, {})
        limit = self.view.max_models_per_worker
        if limit and len(here) + len(reserved) >= limit:
            return False
        budget = worker.memory_bytes
        if not budget:
            return True
        used = sum(self.memory.get(p.model, 0) for p in here) + sum(reserved.values())
        return used + self.model.resources.memory_bytes <= budget

    def rank(self, worker: WorkerRecord) -> tuple[bool, int, float]:
        is_warm = self.model.name in self.view.warm.get(worker.id, frozenset())
        count = sum(1 for p in self.held if p.worker_id == worker.id)
        count += len(self.view.reserved.get(worker.id, {}))
        return (not is_warm, -count, worker.started_at)

    def sleeping_victim(self) -> Placement | None:
        """The longest-asleep replica whose unload makes room."""
        options = [
            s
            for s in self.view.sleeping
            if s.worker_id in self.open
            and (s.model, s.worker_id) not in self.view.unloading
            and self.fits(self.open[s.worker_id], evicting=s)
        ]
        return min(options, key=lambda s: s.since) if options else None

    def evictable(self) -> list[Placement]:
        """Placed replicas whose eviction makes room, whatever their traffic."""
        replicas: dict[str, int] = {}
        for p in self.view.placements:
            replicas[p.model] = replicas.get(p.model, 0) + 1
        options: list[Placement] = []
        for p in self.view.placements:
            worker = self.open.get(p.worker_id)
            other = self.view.models.get(p.model)
            if worker is None or other is None or p.model == self.model.name:
                continue
            if replicas[p.model] <= other.scaling.min_replicas:
                continue
            if (p.model, p.worker_id) in self.view.retiring:
                continue
            if self.fits(worker, evicting=p):
                options.append(p)
        return options

    def idle_victim(self) -> Placement | None:
        """The least recently used evictable replica with no request in flight."""
        options: list[tuple[float, Placement]] = []
        for p in self.evictable():
            traffic = self.view.traffic.get(p.model)
            if traffic is None or traffic.in_flight > 0:
                continue
            options.append((max(traffic.last_request_at, p.since), p))
        if not options:
            return None
        return min(options, key=lambda option: option[0])[1]
