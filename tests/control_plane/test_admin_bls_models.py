"""``bls_models``: a registration names the models its code calls through BLS, and the
platform places, loads and unloads them with it on its worker (the control plane does not
read model code, so it cannot find them itself)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.control_plane.test_api import AUTH, Api, api, error_of

pytestmark = pytest.mark.anyio

__all__ = ["api"]  # the fixture, imported to be used here


@pytest.mark.parametrize(
    ("bls_models", "reason"),
    [
        (["../escape"], "bls_models"),
        ([""], "bls_models"),
        (["add_sub", "add_sub"], "more than once"),
        (["bls"], "names the model itself"),
        ([f"m{i}" for i in range(65)], "bls_models"),
    ],
    ids=["path", "empty", "twice", "itself", "too-many"],
)
async def test_a_list_no_worker_could_follow_is_422(api: Api, bls_models: list[str], reason: str):
    response = await api.register("bls", bls_models=bls_models)
    assert response.status_code == 422, response.text
    assert reason in error_of(response)


async def test_the_callees_are_loaded_first_on_the_callers_worker_and_go_with_it(api: Api):
    assert (await api.register("add_sub")).status_code == 201
    created = await api.register("bls", bls_models=["add_sub"])
    assert created.status_code == 201, created.text
    assert created.json()["bls_models"] == ["add_sub"]

    loaded = await api.client.post("/admin/v1/models/bls/load", headers=AUTH)

    assert loaded.status_code == 200, loaded.text
    assert api.workers.loads() == [("w1", "add_sub"), ("w1", "bls")]
    # Only the caller is a replica the activators route to.
    assert [p.model for p in await api.store.list_placements()] == ["bls"]
    unloaded = await api.client.post("/admin/v1/models/bls/unload", headers=AUTH)
    assert unloaded.status_code == 200, unloaded.text
    assert api.workers.unloads() == [("w1", "bls"), ("w1", "add_sub")]


async def test_a_callee_not_registered_is_named_when_the_caller_is_loaded(api: Api):
    await api.register("bls", bls_models=["ghost"])

    response = await api.client.post("/admin/v1/models/bls/load", headers=AUTH)

    assert response.status_code == 503, response.text
    assert "'bls' calls model 'ghost' through BLS, which is not registered" in error_of(response)
    assert api.workers.loads() == []


async def patch(api: Api, name: str, body: dict[str, Any]) -> Any:
    return await api.client.patch(f"/admin/v1/models/{name}", json=body, headers=AUTH)


async def test_a_patch_changes_the_list_and_is_checked_as_a_registration(api: Api):
    await api.register("bls")
    assert (await api.client.get("/admin/v1/models/bls", headers=AUTH)).json()["bls_models"] == []

    changed = await patch(api, "bls", {"bls_models": ["add_sub", "pre"]})
    itself = await patch(api, "bls", {"bls_models": ["bls"]})
    bad = await patch(api, "bls", {"bls_models": ["a/b"]})

    assert changed.status_code == 200, changed.text
    assert changed.json()["bls_models"] == ["add_sub", "pre"]
    assert changed.json()["generation"] == 2
    assert (itself.status_code, bad.status_code) == (422, 422)
    assert "names the model itself" in error_of(itself)
    stored = await api.store.get_model("bls")
    assert stored is not None and stored.bls_models == ("add_sub", "pre")
