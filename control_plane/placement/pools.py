"""Several worker pools behind one placer: a ``Placer`` per pool, chosen per call.

A replica of a model is placed, and reloaded, by the placer of the pool ``routing`` picks
from the model's record; a replica on a worker is retired, put to sleep or unloaded by the
placer of that worker's pool, which holds the worker's reservations and retirements. A
worker the backend no longer lists is left to the default pool's placer, which drops such a
worker's placements as a single placer always did. With one pool (``zeroserve up``, no
``extra_pools``) every call goes to its one placer, exactly as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from control_plane.backends.base import PodBackend, PoolSpec
from control_plane.placement.placer import PlaceProgress, Placer, PlaceResult, WorkerApi
from control_plane.placement.routing import model_backend, pool_for
from control_plane.settings import ControlPlaneSettings
from control_plane.store.base import StateStore
from foundation.records import ModelRecord, Placement, WorkerRecord

__all__ = ["PoolPlacers"]


class PoolPlacers:
    """The placers of every configured pool (``settings.all_pools``), as one.

    Parameters are the ``Placer``'s; each pool's placer reads ``settings.for_pool(pool)``.
    """

    def __init__(
        self,
        store: StateStore,
        backend: PodBackend,
        workers: WorkerApi,
        settings: ControlPlaneSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._backend = backend
        self._pools = settings.all_pools
        self._default = settings.pool
        self.specs = tuple(
            PoolSpec(
                name=pool.name,
                device=pool.device,
                memory_bytes=pool.memory_bytes,
                max_workers=pool.max_workers,
            )
            for pool in self._pools
        )
        """What each pool's workers are, for ``PodBackend.ensure_pool``."""
        self._placers = {
            spec.name: Placer(
                store,
                backend,
                spec,
                workers,
                settings.for_pool(pool),
                clock=clock,
                wall=wall,
            )
            for spec, pool in zip(self.specs, self._pools, strict=True)
        }

    async def ensure_pools(self) -> None:
        """Create or update every pool in the backend."""
        for spec in self.specs:
            await self._backend.ensure_pool(spec)

    def pool_of(self, model: ModelRecord) -> str:
        """The pool ``model``'s replicas go to."""
        return pool_for(
            model_backend(model), model.resources.device, self._pools, default=self._default
        )

    def _of_worker(self, worker_id: str) -> Placer:
        pool = next((w.pool for w in self._backend.list_workers() if w.id == worker_id), None)
        return self._placers.get(pool or self._default, self._placers[self._default])

    # ---- by model ----

    async def place(
        self,
        model: ModelRecord,
        *,
        may_evict: bool = True,
        progress: PlaceProgress | None = None,
    ) -> PlaceResult:
        """``Placer.place`` on the model's pool."""
        return await self._placers[self.pool_of(model)].place(
            model, may_evict=may_evict, progress=progress
        )

    async def reload(self, model: ModelRecord) -> None:
        """``Placer.reload`` on the model's pool; a replica left on another pool's worker
        (its backend changed) is retired instead, so its next one starts on its pool."""
        pool = self._placers[self.pool_of(model)]
        for placement in await self._store.list_placements(model.name):
            placer = self._of_worker(placement.worker_id)
            if placer is not pool:
                await placer.retire(model.name, placement.worker_id, reason="moved")
        await pool.reload(model)

    def is_retiring(self, model: str) -> bool:
        return any(placer.is_retiring(model) for placer in self._placers.values())

    # ---- by worker ----

    async def retire(self, model: str, worker_id: str, *, reason: str) -> None:
        await self._of_worker(worker_id).retire(model, worker_id, reason=reason)

    def retire_soon(self, model: str, worker_id: str, *, reason: str) -> None:
        self._of_worker(worker_id).retire_soon(model, worker_id, reason=reason)

    async def sleep(self, model: str, worker_id: str) -> None:
        await self._of_worker(worker_id).sleep(model, worker_id)

    async def unload_sleeping(self, model: str, worker_id: str) -> None:
        await self._of_worker(worker_id).unload_sleeping(model, worker_id)

    def is_idle(self, worker_id: str, placements: list[Placement]) -> bool:
        return self._of_worker(worker_id).is_idle(worker_id, placements)

    async def stop_worker_if_idle(self, worker_id: str) -> bool:
        return await self._of_worker(worker_id).stop_worker_if_idle(worker_id)

    async def forget_worker(self, worker_id: str) -> None:
        """A worker died: every placer forgets it (the backend no longer says whose it was)."""
        for placer in self._placers.values():
            await placer.forget_worker(worker_id)

    # ---- by pool ----

    async def start_worker(self, pool: str) -> WorkerRecord:
        """``Placer.start_worker`` on ``pool``."""
        return await self._placers[pool].start_worker()

    async def close(self) -> None:
        for placer in self._placers.values():
            await placer.close()
