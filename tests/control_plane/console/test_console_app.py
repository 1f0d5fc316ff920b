"""The console in process (no activator: a standalone control plane's admin port)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest

from control_plane.api.console.guard import COOKIE, SECURITY_HEADERS
from tests.control_plane.test_api import TOKEN, Api, running_api

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as served:
        yield served


async def log_in(api: Api) -> dict[str, str]:
    response = await api.client.post("/console/login", data={"token": TOKEN})
    assert response.status_code == 303
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
