"""Which ensembles use which models: cycles refused in Triton's words (as Triton 2.51
answered for a self-referencing ensemble and for two ensembles using each other), users
found, and ensembles parked until a model they use is back."""

from __future__ import annotations

import pytest

from data_plane.ensemble.dependencies import Dependencies, EnsembleCycleError


def test_an_ensemble_using_itself_is_a_cycle():
    with pytest.raises(EnsembleCycleError) as refused:
        Dependencies().declare("self_ref", ["self_ref"])

    assert str(refused.value) == (
        "circular dependency between ensembles: self_ref -> ... -> self_ref -> self_ref"
    )


def test_two_ensembles_using_each_other_are_a_cycle_each_reports_from_itself():
    dependencies = Dependencies()
    dependencies.declare("cyc_a", ["cyc_b"])

    with pytest.raises(EnsembleCycleError) as refused:
        dependencies.declare("cyc_b", ["cyc_a"])

    assert str(refused.value) == (
        "circular dependency between ensembles: cyc_b -> ... -> cyc_a -> cyc_b"
    )
    assert str(refused.value.seen_from("cyc_a")) == (
        "circular dependency between ensembles: cyc_a -> ... -> cyc_b -> cyc_a"
    )
    assert refused.value.seen_from("other") is None
    assert dependencies.uses_of("cyc_b") is None


def test_a_longer_cycle_names_the_ensemble_that_closes_it():
    dependencies = Dependencies()
    dependencies.declare("a", ["b", "model"])
    dependencies.declare("b", ["c"])

    with pytest.raises(EnsembleCycleError) as refused:
        dependencies.declare("c", ["model", "a"])

    assert str(refused.value) == "circular dependency between ensembles: c -> ... -> b -> c"


def test_shared_composing_models_are_no_cycle():
    dependencies = Dependencies()
    dependencies.declare("left", ["pre", "model"])
    dependencies.declare("right", ["pre", "model"])
    dependencies.declare("both", ["left", "right"])

    assert dependencies.users_of("model") == ["left", "right"]
    assert dependencies.users_of("left") == ["both"]


def test_a_parked_ensemble_waits_for_its_model_and_uses_nothing_meanwhile():
    dependencies = Dependencies()
    dependencies.declare("pipe", ["pre", "model"])
    uses = dependencies.uses_of("pipe")
    assert uses == ("pre", "model")

    dependencies.forget("pipe")
    dependencies.park("pipe", uses)

    assert dependencies.users_of("model") == []
    assert dependencies.waiting_on("model") == ["pipe"]
    assert dependencies.waiting_on("other") == []
    dependencies.declare("pipe", ["pre", "model"])
    assert dependencies.waiting_on("model") == []
    assert dependencies.users_of("model") == ["pipe"]


def test_restore_puts_back_what_a_failed_load_replaced():
    dependencies = Dependencies()
    dependencies.declare("pipe", ["old"])
    previous = dependencies.uses_of("pipe")
    dependencies.declare("pipe", ["new"])

    dependencies.restore("pipe", previous)
    assert dependencies.users_of("old") == ["pipe"]
    dependencies.restore("pipe", None)
    assert dependencies.uses_of("pipe") is None
