"""Registration holds model names to the rule every worker applies: what the admin API
accepts, a worker can load."""

from __future__ import annotations

import pytest

from foundation.names import MODEL_NAME_MAX_LENGTH
from tests.control_plane.test_api import AUTH, Api, api, error_of
from tests.foundation.test_names import BAD_NAMES

pytestmark = pytest.mark.anyio

__all__ = ["api"]  # the fixture, imported to be used here


@pytest.mark.parametrize("name", BAD_NAMES)
async def test_a_name_no_worker_could_load_is_422(api: Api, name: str):
    response = await api.register(name, storage_uri="/models/m")
    assert response.status_code == 422, response.text
    assert response.json()["fields"] == ["name"]
    assert "name" in error_of(response)
    listed = await api.client.get("/admin/v1/models", headers=AUTH)
    assert listed.json()["models"] == []


@pytest.mark.parametrize(
    "name", ["resnet50.v2", "a_b-c.1", "x" * MODEL_NAME_MAX_LENGTH], ids=["dotted", "mixed", "long"]
)
async def test_a_name_within_the_rule_registers_and_loads(api: Api, name: str):
    response = await api.register(name)
    assert response.status_code == 201, response.text
    loaded = await api.client.post(f"/admin/v1/models/{name}/load", headers=AUTH)
    assert loaded.status_code == 200, loaded.text
    assert api.workers.loads() == [("w1", name)]
