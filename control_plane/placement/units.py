"""Units of placement: a model and the models it runs are placed together on one worker,
its room the sum of theirs, and unloaded together.

Two kinds of model run others on their worker: an ensemble, whose steps name them in its
config (``ensemble_scheduling``; the admin API requires an ensemble to be registered with
it), and a Python model calling others through BLS, which names them in its code; its
registration lists them (``bls_models``), since the control plane does not read model code.
A worker serves such a model only while the models it runs are loaded there (the data plane
takes an ensemble out of service with any model it uses; a BLS call to a model the worker
lacks fails), and the requests between them never leave the worker. So the placer loads the
parts on the chosen worker first, deepest first, then the model, and publishes only the
model's placement: its parts are its own, not replicas the activators route to. When the
model's replica goes (idle, evicted), its parts go with it, unless the worker still needs
them: a placement of their own there, or another model placed there that runs them. A
part's own placement going away likewise leaves the part loaded while a model on that
worker runs it.
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
    """The models ``model`` runs, each once: an ensemble's steps' models, then the models
    its registration calls through BLS; () for a model that runs none."""
    steps = []
    if is_ensemble(model) and model.config is not None:
        steps = model.config.get("ensemble_scheduling", {}).get("step", [])
    names = [str(step.get("model_name", "")) for step in steps]
    return tuple(dict.fromkeys([*names, *model.bls_models]))


def _how_it_runs(model: ModelRecord, part: str) -> str:
    if part in model.bls_models:
        return f"model '{model.name}' calls model '{part}' through BLS"
    return f"ensemble '{model.name}' runs model '{part}'"


def parts_of(model: ModelRecord, models: Mapping[str, ModelRecord]) -> tuple[ModelRecord, ...]:
    """Every model ``model`` runs, through the models those run, each once, the deepest
    first (so each loads after what it uses); () for a model that runs none.

    Raises NoCapacityError naming a part that is not registered, or a cycle.
    """
    ordered: dict[str, ModelRecord] = {}

    def visit(record: ModelRecord, path: tuple[str, ...]) -> None:
        for name in composing_names(record):
            if name in path:
                cycle = " -> ".join((*path[path.index(name) :], name))
                raise NoCapacityError(model=model.name, reason=f"models run each other: {cycle}")
            part = models.get(name)
            if part is None:
                raise NoCapacityError(
                    model=model.name,
                    reason=f"{_how_it_runs(record, name)}, which is not registered",
                )
            if name not in ordered:
                visit(part, (*path, name))
                ordered[name] = part

    visit(model, (model.name,))
    return tuple(ordered.values())


def unit_record(model: ModelRecord, models: Mapping[str, ModelRecord]) -> ModelRecord:
    """``model`` with the memory of its whole unit (itself and its parts), for choosing and
    reserving room; ``model`` itself when it runs no other model."""
    parts = parts_of(model, models)
    if not parts:
        return model
    memory = model.resources.memory_bytes + sum(p.resources.memory_bytes for p in parts)
    resources = ResourceSpec(device=_device(model, parts), memory_bytes=memory)
    return dataclasses.replace(model, resources=resources)


def unit_records(models: Mapping[str, ModelRecord]) -> dict[str, ModelRecord]:
    """Every registered model as :func:`unit_record` sees it (a model whose parts are not
    all registered counts alone: it cannot be placed anyway)."""
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
    """The workers' API as retiring sees it, with units: unloading a model that runs others
    (an ensemble, a BLS caller) unloads the parts the worker no longer needs after it, and
    unloading a part that a model placed on the worker runs only forgets it (the worker
    keeps it).

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
            logger.info("kept %s loaded on %s: a model placed there runs it", model, worker.id)
            return
        await self._workers.unload(worker, model)
        record = models.get(model)
        if record is None:
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
            logger.info("unloaded %s from %s with %s, which ran it", part.name, worker.id, model)

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
        ``leaving``): those replicas' models and the models they run."""
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
