"""The console in process (no activator: a standalone control plane's admin port)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
from starlette.routing import Route

from control_plane.api.console.guard import COOKIE, SECURITY_HEADERS
from control_plane.api.console.routes import console_routes
from tests.control_plane.test_api import TOKEN, Api, running_api

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as served:
        yield served


async def log_in(api: Api) -> dict[str, str]:
    response = await api.client.post("/console/login", data={"token": TOKEN})
    assert response.status_code == 303
    assert response.headers["location"] == "/console/login/check"
    set_cookie = response.headers["set-cookie"].lower()
    for flag in ("secure", "httponly", "samesite=strict", "path=/console"):
        assert flag in set_cookie
    return {"Cookie": f"{COOKIE}={response.cookies[COOKIE]}"}


async def test_pages_need_a_session_and_carry_the_security_headers(api: Api):
    page = await api.client.get("/console/models")
    assert page.status_code == 303 and page.headers["location"] == "/console/login"
    for name, value in SECURITY_HEADERS.items():
        assert page.headers[name] == value
    follow = await api.client.get("/console/models/m/follow")
    assert follow.status_code == 401
    static = await api.client.get("/console/static/console.js")
    assert static.status_code == 200 and "EventSource" in static.text
    assert "no-store" not in static.headers.get("cache-control", "")
    # The admin API itself still takes only its bearer token.
    cookie = await log_in(api)
    assert (await api.client.get("/admin/v1/models", headers=cookie)).status_code == 401


async def test_without_an_activator_the_request_columns_say_not_available(api: Api):
    cookie = await log_in(api)
    await api.register("m")
    page = await api.client.get("/console/models", headers=cookie)
    assert page.status_code == 200
    assert page.headers["cache-control"] == "no-store"
    assert "not available: no activator in this process" in page.text
    # GPU-seconds come from the usage the control plane records, activator or not.
    assert 'class="gpu-hour"' in page.text and "0 serving" in page.text
    # No inline script or style anywhere: the CSP would block it.
    assert not re.search(r"<script(?![^>]*\bsrc=)", page.text)
    assert " style=" not in page.text and "<style" not in page.text


async def test_load_from_the_console_returns_at_once_and_the_load_goes_on(api: Api):
    cookie = await log_in(api)
    await api.register("m")
    api.workers.load_gate = asyncio.Event()
    page = await api.client.get("/console/models/m", headers=cookie)
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert csrf is not None
    response = await api.client.post(
        "/console/models/m/load", data={"csrf": csrf.group(1)}, headers=cookie
    )
    assert response.status_code == 303
    assert response.headers["location"] == "/console/models/m?msg=loading+m"
    # The load waits at the worker: the console answered before it ended.
    assert not await api.store.list_placements("m")
    following = asyncio.create_task(
        api.client.get("/console/models/m/follow?wait_s=10", headers=cookie)
    )
    await asyncio.sleep(0.2)
    api.workers.load_gate.set()
    follow = await following
    assert follow.status_code == 200
    assert follow.text.rstrip().endswith("event: end\ndata: {}")
    assert '"outcome":"ready"' in follow.text
    unknown = await api.client.post(
        "/console/models/m/explode", data={"csrf": csrf.group(1)}, headers=cookie
    )
    assert unknown.status_code == 404


async def test_keys_are_made_shown_once_and_revoked_through_the_admin_apis_keys(api: Api):
    cookie = await log_in(api)
    page = await api.client.get("/console/keys", headers=cookie)
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert csrf is not None
    form = {"name": "team-a", "models": "m, n-*", "requests_per_s": "5"}
    refused = await api.client.post("/console/keys", data=form, headers=cookie)
    assert refused.status_code == 403
    created = await api.client.post(
        "/console/keys", data={**form, "csrf": csrf.group(1)}, headers=cookie
    )
    assert created.status_code == 200
    shown = re.search(r'<pre id="new-key">(zs_([0-9a-z]+)_[^<]+)</pre>', created.text)
    assert shown is not None
    key, key_id = shown.groups()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    (listed,) = (await api.client.get("/admin/v1/keys", headers=auth)).json()["keys"]
    assert listed["id"] == key_id and listed["models"] == ["m", "n-*"]
    assert listed["limits"]["requests_per_s"] == 5 and listed["state"] == "active"
    again = await api.client.get("/console/keys", headers=cookie)
    assert key_id in again.text and key not in again.text

    revoked = await api.client.post(
        f"/console/keys/{key_id}/revoke", data={"csrf": csrf.group(1)}, headers=cookie
    )
    assert revoked.status_code == 303
    assert revoked.headers["location"] == f"/console/keys?msg=revoked+key+{key_id}"
    state = (await api.client.get(f"/admin/v1/keys/{key_id}", headers=auth)).json()["state"]
    assert state == "revoked"
    unknown = await api.client.post(
        "/console/keys/nope/revoke", data={"csrf": csrf.group(1)}, headers=cookie
    )
    assert unknown.status_code == 303 and "error=" in unknown.headers["location"]
    invalid = await api.client.post(
        "/console/keys", data={"name": "", "csrf": csrf.group(1)}, headers=cookie
    )
    assert invalid.status_code == 303 and "error=" in invalid.headers["location"]


async def test_every_change_without_the_csrf_token_is_refused_and_changes_nothing(api: Api):
    """Each POST route of the console but the login form (there is no session yet to carry
    a token), with a session and without its CSRF token or with a wrong one: 403."""
    cookie = await log_in(api)
    await api.register("m")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    made = await api.client.post("/admin/v1/keys", json={"name": "k"}, headers=auth)
    key_id = made.json()["id"]
    posts = [
        route.path
        for route in console_routes()
        if isinstance(route, Route)
        and "POST" in (route.methods or ())
        and route.path != "/console/login"
    ]
    paths = [
        path.format(name="m", key_id=key_id, action=action)
        for path in posts
        for action in (("load", "unload", "scaling", "delete") if "{action}" in path else ("",))
    ]
    assert "/console/models/m/delete" in paths and f"/console/keys/{key_id}/revoke" in paths
    assert "/console/logout" in paths and "/console/models" in paths
    for path in paths:
        for form in ({"name": "n", "min_replicas": "1"}, {"name": "n", "csrf": "0" * 64}):
            refused = await api.client.post(path, data=form, headers=cookie)
            assert refused.status_code == 403, path
            assert "CSRF" in refused.text
    models = (await api.client.get("/admin/v1/models", headers=auth)).json()["models"]
    assert [(m["name"], m["scaling"]["min_replicas"]) for m in models] == [("m", 0)]
    assert not await api.store.list_placements("m")
    key = (await api.client.get(f"/admin/v1/keys/{key_id}", headers=auth)).json()
    assert key["state"] == "active"
    # The session is still there: logging out needed the token too.
    assert (await api.client.get("/console/models", headers=cookie)).status_code == 200


async def test_a_login_whose_cookie_the_browser_dropped_says_why(api: Api):
    """A Secure cookie is dropped by a browser on plain http other than loopback: the page a
    login lands on says so (and what to do), where the login form would come back blank."""
    cookie = await log_in(api)
    kept = await api.client.get("/console/login/check", headers=cookie)
    assert kept.status_code == 303 and kept.headers["location"] == "/console/models"
    dropped = await api.client.get("/console/login/check")
    assert dropped.status_code == 400
    assert "did not keep the session cookie" in dropped.text and "https" in dropped.text
    for name, value in SECURITY_HEADERS.items():
        assert dropped.headers[name] == value
