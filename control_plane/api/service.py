"""What the admin API does, free of HTTP: register, change, list, delete, load and unload.

The routes parse and validate requests into ``api.schemas`` models and call these methods;
everything here raises ``control_plane.errors`` only. Reads work on every control-plane
replica; acts on workers (load, unload, delete, reload) need the lease. A ``load`` on a
replica that does not act is passed to the acting one through the store and answered as
accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from control_plane import usage
from control_plane.api import schemas
from control_plane.backends.base import PodBackend
from control_plane.errors import (
    ConflictError,
    ModelExistsError,
    ModelNotFoundError,
    NotActingError,
    SchemaValidationError,
)
from control_plane.store.base import StateStore, StoreConflictError
from foundation.records import ModelRecord, Placement, ResourceSpec, ScalingSpec

__all__ = [
    "Acting",
    "ActivationControl",
    "AdminService",
    "FollowLimits",
    "Inspector",
    "ReplicaControl",
    "ServedVersions",
]

logger = logging.getLogger(__name__)

_RELOAD_FIELDS = ("storage_uri", "platform", "backend", "config", "bls_models", "resources")


class ActivationControl(Protocol):
    """What the admin service needs of the orchestrator."""

    async def activate(self, model: str, *, trigger: str = ...) -> Placement: ...

    def is_activating(self, model: str) -> bool: ...

    async def settle(self, model: str) -> None: ...

    def block(self, model: str) -> None: ...

    def unblock(self, model: str) -> None: ...


class ReplicaControl(Protocol):
    """What the admin service needs of the placer."""

    async def retire(self, model: str, worker_id: str, *, reason: str) -> None: ...

    async def unload_sleeping(self, model: str, worker_id: str) -> None: ...

    def is_retiring(self, model: str) -> bool: ...

    async def reload(self, model: ModelRecord) -> None: ...


class Acting(Protocol):
    @property
    def is_acting(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class FollowLimits:
    """Bounds of one follow of activations (``AdminService.follow``)."""

    poll_s: float = 0.5
    """How often the store is read."""
    max_s: float = 1800.0
    """Longest one follow lasts; a ``running`` timeline older than this is abandoned."""


class Inspector(Protocol):
    """Checks a registration against its stored model (``inspection.RegistrationInspector``)."""

    async def check(self, record: ModelRecord) -> None: ...


class ServedVersions(Protocol):
    """Asks a worker which versions of a model it serves (``WorkerClient.served_versions``);
    None when it cannot say."""

    async def served_versions(self, url: str, model: str) -> list[str] | None: ...


class AdminService:
    """The admin API's operations over the store, the orchestrator and the placer."""

    def __init__(
        self,
        store: StateStore,
        activations: ActivationControl,
        replicas: ReplicaControl,
        backend: PodBackend,
        acting: Acting,
        *,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        follow: FollowLimits | None = None,
        inspector: Inspector | None = None,
        versions: ServedVersions | None = None,
    ) -> None:
        self._clock = clock
        self._versions = versions
        self._follow = follow or FollowLimits()
        self._store = store
        self._inspector = inspector
        self._activations = activations
        self._replicas = replicas
        self._backend = backend
        self._acting = acting
        self._wall = wall
        self._tasks: set[asyncio.Task[None]] = set()
        self._reloads: dict[str, asyncio.Task[None]] = {}
        """model -> its reload after an update, which an unload or delete waits for."""

    @property
    def store(self) -> StateStore:
        """The state store the service works on."""
        return self._store

    # ---- models ----

    async def register(
        self, body: schemas.ModelCreate, *, dry_run: bool = False
    ) -> schemas.ModelView:
        """Register ``body`` once its stored model passes the inspector's check;
        ``dry_run`` checks and answers the view without registering."""
        record = ModelRecord(
            name=body.name,
            storage_uri=body.storage_uri,
            backend=body.backend,
            platform=body.platform,
            config=body.config,
            bls_models=tuple(body.bls_models),
            scaling=ScalingSpec(**body.scaling.model_dump()),
            resources=ResourceSpec(**body.resources.model_dump()),
            generation=1,
            created_at=self._wall(),
        )
        if await self._store.get_model(body.name) is not None:
            raise ModelExistsError(model=body.name)
        await self._inspect(record)
        if dry_run:
            return await self._view(record)
        try:
            await self._store.create_model(record)
        except StoreConflictError:
            raise ModelExistsError(model=body.name) from None
        logger.info("registered %s from %s", record.name, record.storage_uri)
        return await self._view(record)

    async def list_models(self) -> schemas.ModelList:
        records = await self._store.list_models()
        return schemas.ModelList(models=[await self._view(r) for r in records])

    async def get(self, name: str) -> schemas.ModelView:
        """The view of ``name``, with the versions a ready replica serves (the one view
        that asks a worker: lists do not)."""
        record = await self._record(name)
        return await self._view(record, served_versions=await self.served_versions(name))

    async def served_versions(self, name: str) -> list[str] | None:
        """The numbered versions of ``name`` that one ready replica serves, as its worker
        says; None with no ready replica, no ``versions`` to ask through, or no answer.
        The replica asked is the newest of the newest registration generation."""
        if self._versions is None:
            return None
        placements = await self._store.list_placements(name)
        if not placements:
            return None
        newest = max(placements, key=lambda p: (p.generation, p.since))
        return await self._versions.served_versions(newest.url, name)

    async def update(
        self, name: str, patch: schemas.ModelPatch, *, dry_run: bool = False
    ) -> schemas.ModelView:
        """Apply ``patch``; raises ``SchemaValidationError`` when the merged scaling is bad
        and ``InvalidRegistrationError`` when the changed model fails the inspector's
        check. A change that reloads clears a recorded failure. ``dry_run`` checks and
        answers the view without changing anything."""
        record = await self._record(name)
        scaling = schemas.merge_scaling(dataclasses.asdict(record.scaling), patch.scaling)
        changes: dict[str, Any] = {}
        for field in ("storage_uri", "platform", "backend"):
            value = getattr(patch, field)
            if value is not None and value != getattr(record, field):
                changes[field] = value
        if "config" in patch.model_fields_set and patch.config != record.config:
            changes["config"] = patch.config
        if patch.bls_models is not None:
            problem = schemas.bls_self_call_problem(record.name, patch.bls_models)
            if problem is not None:
                raise SchemaValidationError(errors=[("bls_models", problem)])
            if tuple(patch.bls_models) != record.bls_models:
                changes["bls_models"] = tuple(patch.bls_models)
        if scaling is not None and scaling.model_dump() != dataclasses.asdict(record.scaling):
            changes["scaling"] = ScalingSpec(**scaling.model_dump())
        if patch.resources is not None:
            merged = {
                **dataclasses.asdict(record.resources),
                **patch.resources.model_dump(exclude_none=True),
            }
            resources = ResourceSpec(**merged)
            if resources != record.resources:
                changes["resources"] = resources
        if not changes:
            return await self._view(record)
        reloads = any(f in changes for f in _RELOAD_FIELDS)
        updated = dataclasses.replace(
            record,
            generation=record.generation + 1,
            failure=None if reloads else record.failure,
            **changes,
        )
        if reloads:
            await self._inspect(updated)
        if dry_run:
            return await self._view(updated)
        try:
            await self._store.update_model(updated, expected_generation=record.generation)
        except StoreConflictError:
            if await self._store.get_model(name) is None:
                raise ModelNotFoundError(model=name) from None
            raise ConflictError(
                f"model '{name}' was changed by another request meanwhile; read it and try again"
            ) from None
        logger.info("updated %s: %s", name, ", ".join(sorted(changes)))
        if reloads and self._acting.is_acting:
            task = asyncio.create_task(self._reload(updated), name=f"reload-{name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            self._reloads[name] = task
        return await self._view(updated)

    async def delete(self, name: str) -> None:
        """Unload every replica, then forget the model."""
        await self._record(name)
        self._require_acting()
        self._activations.block(name)
        try:
            await self._activations.settle(name)
            await self._settle_reload(name)
            await self._retire_all(name, reason="deleted")
            if not await self._store.delete_model(name):
                raise ModelNotFoundError(model=name)
        finally:
            self._activations.unblock(name)
        logger.info("deleted %s", name)

    async def load(self, name: str) -> tuple[schemas.ModelView, bool]:
        """Bring the model up; (view, True) once loaded, (view, False) when passed on.

        A recorded failure is cleared first: an explicit load is the one way to try a
        failed model again without changing its registration."""
        record = await self._record(name)
        if record.failure is not None:
            with contextlib.suppress(StoreConflictError):
                # A conflict means the registration changed meanwhile, which cleared it.
                await self._store.update_model(
                    dataclasses.replace(record, failure=None),
                    expected_generation=record.generation,
                )
        if not self._acting.is_acting:
            await self._store.request_activation(name)
            return await self.get(name), False
        await self._activations.activate(name, trigger="admin")
        return await self.get(name), True

    async def unload(self, name: str) -> schemas.ModelView:
        """Take every replica away (models with min_replicas > 0 come back by the autoscaler)."""
        await self._record(name)
        self._require_acting()
        await self._activations.settle(name)
        # A reload started by an update must not put back what this unload takes away.
        await self._settle_reload(name)
        await self._retire_all(name, reason="admin")
        return await self.get(name)

    async def usage(self, name: str, *, start: float, end: float) -> schemas.UsageView:
        """What ``name`` cost over [start, end) (the reaper writes it every few seconds)."""
        record = await self._record(name)
        doc = await self._store.get_model_state(name, usage.STATE_KEY)
        ledger = usage.UsageLedger.from_json(doc) if doc else usage.UsageLedger()
        total = usage.totals(ledger, start=start, end=end)
        return schemas.UsageView(
            model=name,
            start=start,
            end=end,
            device=record.resources.device,  # type: ignore[arg-type]
            bucket_s=usage.BUCKET_S,
            replica_seconds=schemas.ReplicaSeconds(
                serving=total.serving_s, idle=total.idle_s, loading=total.loading_s
            ),
            activations=total.activations,
            cold_starts=total.cold_starts,
            cold_start_wait_s=total.cold_start_wait_s,
        )

    async def activations(self, name: str) -> schemas.Activations:
        await self._record(name)
        return schemas.Activations(model=name, activations=await self._store.list_activations(name))

    def start_load(self, name: str) -> None:
        """``load`` without waiting for it (the console follows it through ``follow``); its
        failure is recorded in the activation's timeline and logged."""

        async def run() -> None:
            try:
                await self.load(name)
            except Exception as exc:
                logger.warning("loading %s failed: %s", name, exc)

        task = asyncio.create_task(run(), name=f"load-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def follow(
        self, name: str, *, wait_s: float
    ) -> AsyncGenerator[list[dict[str, Any]], None]:
        """The activations of ``name`` as they change: one list per read of the store (every
        ``FollowLimits.poll_s``), holding each timeline that is running, or that started
        after following began, whenever it differs from what was last given; often empty.

        Ends once every activation seen has finished, or when none started within
        ``wait_s`` (0: only what runs now), or after ``FollowLimits.max_s``. Raises
        ``ModelNotFoundError`` before the first list when there is no such model.
        """
        await self._record(name)
        limits = self._follow
        started = self._clock()
        wait_s = min(max(wait_s, 0.0), limits.max_s)
        given: dict[str, dict[str, Any]] = {}
        finished_before: set[str] | None = None
        while True:
            timelines = await self._store.list_activations(name)
            abandoned_before = self._wall() - limits.max_s

            def is_running(t: dict[str, Any], before: float = abandoned_before) -> bool:
                return t.get("outcome") == "running" and float(t.get("queued_at", 0)) > before

            if finished_before is None:
                finished_before = {t["id"] for t in timelines if not is_running(t)}
            changed = []
            for timeline in reversed(timelines):  # oldest first
                if timeline["id"] in finished_before or given.get(timeline["id"]) == timeline:
                    continue
                given[timeline["id"]] = timeline
                changed.append(timeline)
            yield changed
            is_any_running = any(is_running(t) for t in timelines)
            elapsed = self._clock() - started
            if not is_any_running and (given or elapsed >= wait_s):
                return
            if elapsed >= limits.max_s:
                return
            await asyncio.sleep(limits.poll_s)

    # ---- workers ----

    async def workers(self) -> schemas.WorkerList:
        placements = await self._store.list_placements()
        views = []
        for worker in await self._store.list_workers():
            views.append(
                schemas.WorkerView(
                    id=worker.id,
                    url=worker.url,
                    grpc_address=worker.grpc_address,
                    pool=worker.pool,
                    device=worker.device,
                    memory_bytes=worker.memory_bytes,
                    state=str(worker.state),
                    started_at=worker.started_at,
                    models=sorted(p.model for p in placements if p.worker_id == worker.id),
                    details=dict(self._backend.details(worker.id)),
                )
            )
        return schemas.WorkerList(workers=views)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- helpers ----

    async def _record(self, name: str) -> ModelRecord:
        record = await self._store.get_model(name)
        if record is None:
            raise ModelNotFoundError(model=name)
        return record

    async def _inspect(self, record: ModelRecord) -> None:
        if self._inspector is not None:
            await self._inspector.check(record)

    def _require_acting(self) -> None:
        if not self._acting.is_acting:
            raise NotActingError()

    async def _retire_all(self, name: str, *, reason: str) -> None:
        placements = await self._store.list_placements(name)
        sleeping = await self._store.list_sleeping(name)
        await asyncio.gather(
            *(self._replicas.retire(name, p.worker_id, reason=reason) for p in placements),
            *(self._replicas.unload_sleeping(name, s.worker_id) for s in sleeping),
        )

    async def _settle_reload(self, name: str) -> None:
        task = self._reloads.pop(name, None)
        if task is not None and not task.done():
            await asyncio.wait([task])

    async def _reload(self, record: ModelRecord) -> None:
        try:
            await self._replicas.reload(record)
        except Exception as exc:
            logger.warning("reloading %s after an update failed: %s", record.name, exc)

    async def _view(
        self, record: ModelRecord, *, served_versions: list[str] | None = None
    ) -> schemas.ModelView:
        placements = await self._store.list_placements(record.name)
        sleeping = await self._store.list_sleeping(record.name)
        reports = await self._store.traffic(record.name)
        timelines = await self._store.list_activations(record.name)
        last = timelines[0] if timelines else None
        state: schemas.ModelState
        if placements:
            state = "ready"
        elif self._activations.is_activating(record.name):
            state = "loading"
        elif self._replicas.is_retiring(record.name):
            state = "unloading"
        elif sleeping:
            state = "sleeping"
        elif record.failure is not None or (last is not None and last.get("outcome") == "failed"):
            state = "failed"
        else:
            state = "scaled_to_zero"
        return schemas.ModelView(
            name=record.name,
            storage_uri=record.storage_uri,
            platform=record.platform,
            backend=record.backend,
            config=record.config,
            bls_models=list(record.bls_models),
            scaling=schemas.ScalingSpec(**dataclasses.asdict(record.scaling)),
            resources=schemas.ResourceSpec.model_validate(dataclasses.asdict(record.resources)),
            generation=record.generation,
            created_at=record.created_at,
            status=schemas.ModelStatus(
                state=state,
                replicas=[
                    schemas.Replica(
                        worker_id=p.worker_id, url=p.url, generation=p.generation, since=p.since
                    )
                    for p in placements
                ],
                sleeping=[
                    schemas.Replica(
                        worker_id=s.worker_id, url=s.url, generation=s.generation, since=s.since
                    )
                    for s in sleeping
                ],
                served_versions=served_versions,
                in_flight=sum(r.in_flight for r in reports),
                last_request_at=max((r.last_request_at for r in reports), default=None),
                last_activation=last,
                failure=(
                    None
                    if record.failure is None
                    else schemas.Failure(
                        reason=record.failure.reason, failed_at=record.failure.failed_at
                    )
                ),
            ),
        )
