"""Ensembles as units of placement: an ensemble and the models its steps run are placed
together on one worker, its room the sum of theirs, and unloaded together.

A worker serves an ensemble only while its composing models are loaded there (the data
plane takes an ensemble out of service with any model it uses), and the requests between
steps never leave the worker. So the placer loads an ensemble's parts on the chosen worker
first, deepest first, then the ensemble, and publishes only the ensemble's placement: its
parts are its own, not replicas the activators route to. When the ensemble's replica goes
(idle, evicted), its parts go with it, unless the worker still needs them: a placement of
their own there, or another ensemble placed there that uses them. A part's own placement
going away likewise leaves the part loaded while an ensemble on that worker uses it.

Which models an ensemble uses is read from its registered config (``ensemble_scheduling``);
the admin API requires an ensemble to be registered with it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence

from control_plane.errors import NoCapacityError
from control_plane.placement.retire import ReplicaUnloader
from control_plane.store.base import StateStore
from foundation import ensemble_config
from foundation.records import ModelRecord, ResourceSpec, WorkerRecord

__all__ = [
    "UnitWorkers",
    "composing_names",
    "is_ensemble",
    "parts_of",
    "unit_record",
    "unit_records",
]

logger = logging.getLogger(__name__)


def is_ensemble(model: ModelRecord) -> bool:
    """Whether ``model`` is registered as an ensemble (by platform or by its config)."""
    return model.platform == ensemble_config.ENSEMBLE_PLATFORM or (
        model.config is not None
        and model.config.get("platform") == ensemble_config.ENSEMBLE_PLATFORM
    )


def composing_names(model: ModelRecord) -> tuple[str, ...]:
    """The models ``model``'s steps run, each once; () for a model that is not an ensemble
    or whose registration carries no steps."""
    if not is_ensemble(model) or model.config is None:
        return ()
    steps = model.config.get("ensemble_scheduling", {}).get("step", [])
    return tuple(dict.fromkeys(str(step.get("model_name", "")) for step in steps))


def parts_of(model: ModelRecord, models: Mapping[str, ModelRecord]) -> tuple[ModelRecord, ...]:
    """Every model an ensemble runs, through ensembles of ensembles, each once, the deepest
    first (so each loads after what it uses); () for a model that is not an ensemble.

    Raises NoCapacityError naming a part that is not registered, or a cycle.
    """
    ordered: dict[str, ModelRecord] = {}

    def visit(record: ModelRecord, path: tuple[str, ...]) -> None:
        for name in composing_names(record):
            if name in path:
                cycle = " -> ".join((*path[path.index(name) :], name))
                raise NoCapacityError(model=model.name, reason=f"ensembles use each other: {cycle}")
            part = models.get(name)
            if part is None:
                raise NoCapacityError(
                    model=model.name,
                    reason=f"ensemble '{record.name}' runs model '{name}', which is not registered",
                )
            if name not in ordered:
                visit(part, (*path, name))
                ordered[name] = part

    visit(model, (model.name,))
    return tuple(ordered.values())


def unit_record(model: ModelRecord, models: Mapping[str, ModelRecord]) -> ModelRecord:
    """``model`` with the memory of its whole unit (itself and its parts), for choosing and
    reserving room; ``model`` itself when it is not an ensemble."""
    parts = parts_of(model, models)
    if not parts:
        return model
    memory = model.resources.memory_bytes + sum(p.resources.memory_bytes for p in parts)
    resources = ResourceSpec(device=_device(model, parts), memory_bytes=memory)
    return dataclasses.replace(model, resources=resources)


def unit_records(models: Mapping[str, ModelRecord]) -> dict[str, ModelRecord]:
    """Every registered model as :func:`unit_record` sees it (an ensemble whose parts are
    not all registered counts alone: it cannot be placed anyway)."""
    units = {}
    for name, record in models.items():
        try:
            units[name] = unit_record(record, models)
        except NoCapacityError:
            units[name] = record
    return units


def _device(model: ModelRecord, parts: Iterable[ModelRecord]) -> str:
    """The device the unit needs: a GPU if any of its models needs one."""
    for record in (model, *parts):
        if record.resources.device != "cpu":
            return record.resources.device
    return "cpu"


class UnitWorkers:
    """The workers' API as retiring sees it, with ensembles as units: unloading an
    ensemble unloads the parts the worker no longer needs after it, and unloading a part
    that an ensemble placed on the worker uses only forgets it (the worker keeps it).

    ``workers`` makes the calls; ``store`` tells the placements, sleeping replicas and
    registered models.
    """

    def __init__(self, workers: ReplicaUnloader, store: StateStore) -> None:
        self._workers = workers
        self._store = store

    async def unload(self, worker: WorkerRecord, model: str) -> None:
        models = {m.name: m for m in await self._store.list_models()}
        held = await self._held_on(worker.id)
        if model in self._needed(worker.id, held, models, leaving=model):
            logger.info("kept %s loaded on %s: an ensemble placed there runs it", model, worker.id)
            return
        await self._workers.unload(worker, model)
        record = models.get(model)
        if record is None or not is_ensemble(record):
            return
        try:
            parts = parts_of(record, models)
        except NoCapacityError:
            return
        needed = self._needed(worker.id, held, models, leaving=model)
        # The ensembles among the parts first: the data plane unloads an ensemble with any
        # model it uses, so their order does not matter, but fewer calls fail this way.
        for part in reversed(parts):
            if part.name in needed:
                continue
            await self._workers.unload(worker, part.name)
            logger.info("unloaded %s from %s with ensemble %s", part.name, worker.id, model)

    async def sleep(self, worker: WorkerRecord, model: str) -> None:
        await self._workers.sleep(worker, model)

    async def _held_on(self, worker_id: str) -> list[str]:
        placements = [*await self._store.list_placements(), *await self._store.list_sleeping()]
        return [p.model for p in placements if p.worker_id == worker_id]

    @staticmethod
    def _needed(
        worker_id: str, held: Sequence[str], models: Mapping[str, ModelRecord], *, leaving: str
    ) -> set[str]:
        """The models the worker must keep loaded for the replicas it holds (other than
        ``leaving``): those replicas' models and, for ensembles, their parts."""
        needed: set[str] = set()
        for name in held:
            if name == leaving:
                continue
            needed.add(name)
            record = models.get(name)
            if record is None:
                continue
            try:
                needed.update(part.name for part in parts_of(record, models))
            except NoCapacityError:
                continue
        return needed
