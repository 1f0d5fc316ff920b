"""The admin API's keys in process: created and shown once, stored as a hash, listed
without secrets, revoked (and published), refused when malformed."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from foundation.keys import ALL_KEYS, parse_key
from tests.control_plane.test_api import AUTH, Api, api, error_of

pytestmark = pytest.mark.anyio

__all__ = ["api"]


async def create(api: Api, **body: object) -> dict[str, object]:
    response = await api.client.post(
        "/admin/v1/keys", json={"name": "team-a", **body}, headers=AUTH
    )
    assert response.status_code == 201, response.text
    created: dict[str, object] = response.json()
    return created


async def test_a_key_is_shown_once_and_stored_only_as_its_hash(api: Api):
    created = await create(
        api, models=["mlp", "resnet-*"], limits={"requests_per_s": 5, "max_in_flight": 2}
    )
    token = str(created["key"])
    parsed = parse_key(token)
    assert parsed is not None and parsed[0] == created["id"]
    assert created["state"] == "active" and created["models"] == ["mlp", "resnet-*"]
    assert created["limits"] == {
        "requests_per_s": 5.0,
        "burst": None,
        "max_in_flight": 2,
        "activations_per_hour": None,
    }
    record = await api.store.get_key(str(created["id"]))
    assert record is not None
    assert record.secret_sha256 == hashlib.sha256(parsed[1].encode()).hexdigest()
    assert parsed[1] not in str(record.to_json())
    shown = await api.client.get(f"/admin/v1/keys/{created['id']}", headers=AUTH)
    listed = await api.client.get("/admin/v1/keys", headers=AUTH)
    for response in (shown, listed):
        assert response.status_code == 200
        assert token not in response.text and parsed[1] not in response.text
    assert [k["id"] for k in listed.json()["keys"]] == [created["id"]]
    assert "key" not in shown.json()


async def test_revoking_marks_the_key_and_publishes_it(api: Api):
    created = await create(api)
    revocations = api.store.subscribe_key_revocations()
    try:
        assert await anext(revocations) == ALL_KEYS
        response = await api.client.post(f"/admin/v1/keys/{created['id']}/revoke", headers=AUTH)
        assert response.status_code == 200
        assert response.json()["state"] == "revoked" and response.json()["revoked_at"]
        async with asyncio.timeout(10):
            assert await anext(revocations) == created["id"]
    finally:
        await revocations.aclose()
    listed = (await api.client.get("/admin/v1/keys", headers=AUTH)).json()["keys"]
    assert [k["state"] for k in listed] == ["revoked"]


async def test_expiry_is_given_as_a_time_or_a_duration(api: Api):
    soon = await create(api, expires_in_s=3600)
    assert isinstance(soon["expires_at"], float) and soon["state"] == "active"
    past = await create(api, expires_at=1_000_000.0)
    assert past["state"] == "expired"


@pytest.mark.parametrize(
    "body, field",
    [
        pytest.param({"name": ""}, "name", id="empty-name"),
        pytest.param({"name": "a", "models": []}, "models", id="no-models"),
        pytest.param({"name": "a", "models": ["a b"]}, "models", id="bad-pattern"),
        pytest.param({"name": "a", "limits": {"requests_per_s": 0}}, "limits", id="zero-rate"),
        pytest.param({"name": "a", "limits": {"burst": 3}}, "limits", id="burst-no-rate"),
        pytest.param({"name": "a", "expires_at": 5, "expires_in_s": 5}, "body", id="two-expiries"),
        pytest.param({"name": "a", "secret": "x"}, "secret", id="unknown-field"),
    ],
)
async def test_malformed_keys_are_422(api: Api, body: dict[str, object], field: str):
    response = await api.client.post("/admin/v1/keys", json=body, headers=AUTH)
    assert response.status_code == 422, response.text
    assert any(f.startswith(field) for f in response.json()["fields"]), response.json()


async def test_unknown_key_ids_are_404_and_the_routes_need_the_admin_token(api: Api):
    for method, path in [("GET", "/admin/v1/keys/abc"), ("POST", "/admin/v1/keys/abc/revoke")]:
        response = await api.client.request(method, path, headers=AUTH)
        assert response.status_code == 404
        assert "abc" in error_of(response)
        assert (await api.client.request(method, path)).status_code == 401
    assert (await api.client.post("/admin/v1/keys", json={"name": "x"})).status_code == 401
