"""Ensembles as units of placement: placed with their parts on one worker, their room the
sum of the unit's, and unloaded with them, unless the worker still needs a part."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from control_plane.errors import LoadFailedError, NoCapacityError
from control_plane.placement.units import composing_names, parts_of, unit_record
from foundation.records import ModelRecord, ResourceSpec
from tests.control_plane.placement.test_placer import Setup

pytestmark = pytest.mark.anyio


def ensemble_config(*models: str) -> dict[str, Any]:
    """A config whose steps run ``models`` one after the other."""
    tensors = ["IN", *(f"t{i}" for i in range(1, len(models))), "OUT"]
    return {
        "platform": "ensemble",
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": model,
                    "model_version": -1,
                    "input_map": {"INPUT0": tensors[i]},
                    "output_map": {"OUTPUT0": tensors[i + 1]},
                }
                for i, model in enumerate(models)
            ]
        },
    }


def record(name: str, *, memory: int = 0, device: str = "cpu", config=None) -> ModelRecord:
    return ModelRecord(
        name=name,
        storage_uri=f"/models/{name}",
        platform="ensemble" if config else "",
        config=config,
        resources=ResourceSpec(device=device, memory_bytes=memory),
    )


def test_parts_come_deepest_first_each_once():
    models = {
        "pre": record("pre"),
        "mlp": record("mlp"),
        "inner": record("inner", config=ensemble_config("pre", "mlp")),
        "outer": record("outer", config=ensemble_config("inner", "mlp", "pre")),
    }

    assert composing_names(models["outer"]) == ("inner", "mlp", "pre")
    assert [p.name for p in parts_of(models["outer"], models)] == ["pre", "mlp", "inner"]
    assert parts_of(models["mlp"], models) == ()


def test_a_part_not_registered_or_a_cycle_cannot_be_placed():
    models = {
        "lonely": record("lonely", config=ensemble_config("ghost")),
        "a": record("a", config=ensemble_config("b")),
        "b": record("b", config=ensemble_config("a")),
    }

    with pytest.raises(NoCapacityError, match="runs model 'ghost', which is not registered"):
        parts_of(models["lonely"], models)
    with pytest.raises(NoCapacityError, match="models run each other: a -> b -> a"):
        parts_of(models["a"], models)


def test_a_unit_needs_the_memory_and_the_device_of_all_its_models():
    models = {
        "pre": record("pre", memory=10),
        "mlp": record("mlp", memory=60, device="cuda"),
        "pipe": record("pipe", memory=1, config=ensemble_config("pre", "mlp")),
    }

    unit = unit_record(models["pipe"], models)

    assert (unit.resources.memory_bytes, unit.resources.device) == (71, "cuda")
    assert unit_record(models["pre"], models) is models["pre"]


async def registered(s: Setup, name: str) -> ModelRecord:
    found = await s.store.get_model(name)
    assert found is not None
    return found


async def register_pipeline(s: Setup, *, memory: int = 0) -> ModelRecord:
    await s.register("pre", resources=ResourceSpec(memory_bytes=memory))
    await s.register("mlp", resources=ResourceSpec(memory_bytes=memory))
    return await s.register("pipe", platform="ensemble", config=ensemble_config("pre", "mlp"))


async def test_an_ensemble_is_placed_with_its_parts_and_only_it_is_published():
    async with Setup() as s:
        pipe = await register_pipeline(s)

        result = await s.placer.place(pipe)

        assert s.workers.loads() == [("w1", "pre"), ("w1", "mlp"), ("w1", "pipe")]
        assert [p.model for p in await s.store.list_placements()] == ["pipe"]
        assert result.worker.id == "w1"


async def test_an_ensemble_goes_where_its_whole_unit_fits():
    async with Setup(memory_bytes=100) as s:
        await s.placer.place(await s.register("other", resources=ResourceSpec(memory_bytes=30)))
        pipe = await register_pipeline(s, memory=40)

        result = await s.placer.place(pipe)

        assert result.worker.id == "w2"
        assert result.is_worker_started
        # Placed, the unit holds its room: a 30-byte model no longer fits beside it.
        third = await s.placer.place(
            await s.register("third", resources=ResourceSpec(memory_bytes=30))
        )
        assert third.worker.id == "w1"


async def test_a_unit_larger_than_a_worker_is_refused():
    async with Setup(memory_bytes=100) as s:
        with pytest.raises(NoCapacityError, match="needs 120 bytes"):
            await s.placer.place(await register_pipeline(s, memory=60))


async def test_an_ensemble_whose_part_is_not_registered_is_refused():
    async with Setup() as s:
        lonely = await s.register("lonely", platform="ensemble", config=ensemble_config("ghost"))

        with pytest.raises(NoCapacityError, match="'ghost', which is not registered"):
            await s.placer.place(lonely)
        assert s.workers.loads() == []


async def test_a_refused_part_publishes_nothing_and_unloads_the_parts_loaded():
    async with Setup() as s:
        pipe = await register_pipeline(s)
        s.workers.fail_loads["mlp"] = "400: bad model"

        with pytest.raises(LoadFailedError):
            await s.placer.place(pipe)

        assert s.workers.loads() == [("w1", "pre")]
        assert s.workers.unloads() == [("w1", "mlp"), ("w1", "pre")]
        assert await s.store.list_placements() == []


async def test_retiring_an_ensemble_unloads_its_parts_after_it():
    async with Setup() as s:
        pipe = await register_pipeline(s)
        await s.placer.place(pipe)

        await s.placer.retire("pipe", "w1", reason="idle")

        assert s.workers.unloads() == [("w1", "pipe"), ("w1", "mlp"), ("w1", "pre")]


async def test_parts_the_worker_still_needs_stay_loaded():
    async with Setup() as s:
        pipe = await register_pipeline(s)
        other = await s.register("other", platform="ensemble", config=ensemble_config("mlp"))
        await s.placer.place(pipe)
        await s.placer.place(other)
        await s.placer.place(await registered(s, "pre"))
        assert {p.model for p in await s.store.list_placements()} == {"pipe", "other", "pre"}

        await s.placer.retire("pipe", "w1", reason="idle")

        # mlp runs in "other", pre has a placement of its own: neither goes.
        assert s.workers.unloads() == [("w1", "pipe")]


async def test_a_parts_own_replica_going_leaves_it_loaded_for_the_ensemble():
    async with Setup() as s:
        pipe = await register_pipeline(s)
        await s.placer.place(pipe)
        await s.placer.place(await registered(s, "mlp"))

        await s.placer.retire("mlp", "w1", reason="idle")

        assert s.workers.unloads() == []
        assert [p.model for p in await s.store.list_placements()] == ["pipe"]
        await s.placer.retire("pipe", "w1", reason="idle")
        assert s.workers.unloads() == [("w1", "pipe"), ("w1", "mlp"), ("w1", "pre")]


async def test_an_ensemble_of_ensembles_is_one_unit():
    async with Setup() as s:
        await register_pipeline(s)
        await s.register("post")
        outer = await s.register(
            "outer", platform="ensemble", config=ensemble_config("pipe", "post")
        )

        await s.placer.place(outer)
        await s.placer.retire("outer", "w1", reason="idle")

        assert s.workers.loads() == [
            ("w1", "pre"),
            ("w1", "mlp"),
            ("w1", "pipe"),
            ("w1", "post"),
            ("w1", "outer"),
        ]
        assert s.workers.unloads() == [
            ("w1", "outer"),
            ("w1", "post"),
            ("w1", "pipe"),
            ("w1", "mlp"),
            ("w1", "pre"),
        ]


def test_a_bls_callers_parts_are_its_callees_and_what_they_run():
    models = {
        "add_sub": record("add_sub"),
        "pre": record("pre"),
        "mlp": record("mlp"),
        "pipe": record("pipe", config=ensemble_config("pre", "mlp")),
        "bls": dataclasses.replace(record("bls"), bls_models=("pipe", "add_sub")),
        # An ensemble whose step is a BLS model: its callees come with it too.
        "outer": record("outer", config=ensemble_config("bls")),
    }

    assert composing_names(models["bls"]) == ("pipe", "add_sub")
    assert [p.name for p in parts_of(models["bls"], models)] == ["pre", "mlp", "pipe", "add_sub"]
    assert [p.name for p in parts_of(models["outer"], models)] == [
        "pre",
        "mlp",
        "pipe",
        "add_sub",
        "bls",
    ]


def test_a_bls_callee_not_registered_or_a_bls_cycle_cannot_be_placed():
    models = {
        "lonely": dataclasses.replace(record("lonely"), bls_models=("ghost",)),
        "a": dataclasses.replace(record("a"), bls_models=("b",)),
        "b": record("b", config=ensemble_config("a")),
    }

    with pytest.raises(NoCapacityError, match="'lonely' calls model 'ghost' through BLS, which"):
        parts_of(models["lonely"], models)
    with pytest.raises(NoCapacityError, match="models run each other: a -> b -> a"):
        parts_of(models["a"], models)


async def test_a_bls_caller_goes_where_it_fits_with_its_callee_and_leaves_with_it():
    async with Setup(memory_bytes=100) as s:
        await s.placer.place(await s.register("other", resources=ResourceSpec(memory_bytes=30)))
        await s.register("add_sub", resources=ResourceSpec(memory_bytes=40))
        bls = await s.register(
            "bls", bls_models=("add_sub",), resources=ResourceSpec(memory_bytes=40)
        )

        placed = await s.placer.place(bls)
        await s.placer.retire("bls", placed.worker.id, reason="idle")

        assert placed.worker.id == "w2"
        assert s.workers.loads() == [("w1", "other"), ("w2", "add_sub"), ("w2", "bls")]
        assert [p.model for p in await s.store.list_placements()] == ["other"]
        assert s.workers.unloads() == [("w2", "bls"), ("w2", "add_sub")]
