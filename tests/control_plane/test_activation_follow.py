"""Activations followed live: the running timeline in the store and the SSE endpoint."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from control_plane.api.watch import describe, server_sent_events
from tests.control_plane.test_api import AUTH, Api, running_api

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as served:
        yield served


def events_of(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    assert response.headers["content-type"].startswith("text/event-stream")
    return [(e, json.loads(d)) for e, d in server_sent_events(iter(response.text.splitlines()))]


async def running_timeline(api: Api, model: str, phase: str) -> dict[str, Any]:
    async with asyncio.timeout(10):
        while True:
            for timeline in await api.store.list_activations(model):
                if timeline["outcome"] == "running" and timeline.get("current") == phase:
                    return timeline
            await asyncio.sleep(0.01)


async def test_a_load_is_followed_from_its_running_phase_to_ready(api: Api):
    await api.register("m")
    api.workers.load_gate = asyncio.Event()
    load = asyncio.create_task(api.client.post("/admin/v1/models/m/load", headers=AUTH))
    running = await running_timeline(api, "m", "loading")
    assert [p["phase"] for p in running["phases"]] == ["queued", "worker_starting", "loading"]
    assert running["worker"] == {"id": "w1"}
    assert describe(running).endswith("after queued)")
    follow = asyncio.create_task(
        api.client.get("/admin/v1/models/m/activations?follow=true", headers=AUTH)
    )
    # Let the follow read the running timeline before the load ends.
    await asyncio.sleep(0.2)
    api.workers.load_gate.set()
    assert (await load).status_code == 200
    response = await follow
    assert response.status_code == 200
    events = events_of(response)
    names = [name for name, _ in events]
    assert names[0] == "activation" and names[-1] == "end"
    timelines = [doc for name, doc in events if name == "activation"]
    assert {t["id"] for t in timelines} == {running["id"]}
    assert timelines[0]["outcome"] == "running"
    final = timelines[-1]
    assert final["outcome"] == "ready" and "current" not in final
    assert [p["phase"] for p in final["phases"]] == [
        "queued",
        "worker_ready",
        "fetched",
        "engine_built",
        "ready",
    ]
    assert " ready on w1 in " in describe(final)
    # The finished timeline replaced the running one: one record per activation.
    stored = (await api.client.get("/admin/v1/models/m/activations", headers=AUTH)).json()
    assert [a["id"] for a in stored["activations"]] == [running["id"]]


async def test_a_failed_activation_keeps_the_phase_it_failed_in(api: Api):
    await api.register("m")
    api.workers.fail_loads["m"] = "no such file"
    response = await api.client.post("/admin/v1/models/m/load", headers=AUTH)
    assert response.status_code >= 400
    (timeline,) = await api.store.list_activations("m")
    assert timeline["outcome"] == "failed" and "current" not in timeline
    assert [p["phase"] for p in timeline["phases"]][-1] == "loading"
    assert "failed on w1" in describe(timeline) and "no such file" in describe(timeline)


async def test_following_when_nothing_runs_ends_at_once_with_wait_s_0(api: Api):
    await api.register("m")
    await api.client.post("/admin/v1/models/m/load", headers=AUTH)
    response = await api.client.get(
        "/admin/v1/models/m/activations?follow=true&wait_s=0", headers=AUTH
    )
    # The activation that ended before the follow began is history, not followed.
    assert events_of(response) == [("end", {})]


async def test_following_an_unknown_model_is_404_and_needs_the_token(api: Api):
    response = await api.client.get("/admin/v1/models/nope/activations?follow=true", headers=AUTH)
    assert response.status_code == 404
    assert "nope" in response.json()["error"]
    response = await api.client.get("/admin/v1/models/nope/activations?follow=true")
    assert response.status_code == 401
    for wait in ("soon", "nan", "inf", "-1"):
        bad = await api.client.get(
            f"/admin/v1/models/nope/activations?follow=true&wait_s={wait}", headers=AUTH
        )
        assert bad.status_code == 400, wait


def test_server_sent_events_skip_comments_and_join_data_lines():
    lines = [": hi", "event: activation", "data: {", "data: }", "", "data: x", ""]
    assert list(server_sent_events(iter(lines))) == [("activation", "{\n}"), ("message", "x")]


async def test_the_bytes_a_worker_has_fetched_show_while_it_loads(api: Api):
    await api.register("m")
    api.workers.load_gate = asyncio.Event()
    api.workers.fetching["m"] = (3 * 2**20, 10 * 2**20)
    load = asyncio.create_task(api.client.post("/admin/v1/models/m/load", headers=AUTH))
    async with asyncio.timeout(10):
        while True:
            timelines = await api.store.list_activations("m")
            if timelines and timelines[0].get("bytes_total"):
                running = timelines[0]
                break
            await asyncio.sleep(0.05)
    assert (running["bytes_fetched"], running["bytes_total"]) == (3 * 2**20, 10 * 2**20)
    # Progress is no new phase.
    assert [p["phase"] for p in running["phases"]] == ["queued", "worker_starting", "loading"]
    assert "3.0 MiB of 10.0 MiB fetched" in describe(running)
    api.workers.load_gate.set()
    assert (await load).status_code == 200
    (final,) = await api.store.list_activations("m")
    assert "bytes_total" not in final and final["bytes_fetched"] == 0  # the load's own report
