"""A sequence model through ``zeroserve up``: its first request (the START) activates it
from zero through the activator, its sequences keep their state across requests, the model
stays loaded past its idle timeout while a sequence is live (the worker reports it, and the
reaper leaves the replica), and it is unloaded once the sequence has ended. A real platform
process, real workers, the ONNX accumulator of ``tests.data_plane.sequence.models``; no
duration is asserted."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.data_plane.sequence.models import write_onnx_accumulator
from tests.integration.test_ensemble_platform import register, worker_index
from tests.integration.test_platform_e2e import admin_get, client, eventually, platform_factory

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

__all__ = ["client", "platform_factory"]  # fixtures used by this module's tests

IDLE_TIMEOUT_S = 1.0


async def step(
    client: httpx.AsyncClient, url: str, cid: int | str, value: int, **flags: bool
) -> tuple[int, Any]:
    body = {
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [value]}],
        "parameters": {"sequence_id": cid, **flags},
    }
    response = await client.post(f"{url}/v2/models/acc/infer", json=body)
    payload = response.json()
    if response.status_code == 200:
        payload = next(o["data"][0] for o in payload["outputs"] if o["name"] == "OUTPUT")
    return response.status_code, payload


async def test_a_live_sequence_keeps_its_model_loaded_until_it_ends(
    platform_factory, client: httpx.AsyncClient
):
    # A long grace period keeps the idle worker up, so that its index can be read.
    platform = platform_factory("sequence", ZEROSERVE_CONTROL_PLANE_POOL_GRACE_PERIOD_S="600")
    # The sequence may idle for a minute on the worker; the model only for a second.
    model_dir = write_onnx_accumulator(platform.models_dir, "acc", idle_us=60_000_000)
    registered = await register(
        client,
        platform,
        model_dir,
        scaling={"min_replicas": 0, "idle_timeout_s": IDLE_TIMEOUT_S},
    )
    assert registered.status_code == 201, registered.text

    # From zero: the START waits in the activator's buffer for the activation.
    assert await step(client, platform.public, "s1", 5, sequence_start=True) == (200, 5)
    assert await step(client, platform.public, 2, 1, sequence_start=True) == (200, 1)
    assert await step(client, platform.public, 2, 1, sequence_end=True) == (200, 2)
    (worker,) = (await admin_get(client, platform, "/workers"))["workers"]
    assert worker["models"] == ["acc"]

    # Idle well past the model's timeout, with sequence s1 still live on the worker.
    await asyncio.sleep(5 * IDLE_TIMEOUT_S)
    assert (await worker_index(client, worker["url"])).get("acc") == "READY"
    assert await step(client, platform.public, "s1", 2) == (200, 7)
    assert await step(client, platform.public, "s1", 3, sequence_end=True) == (200, 10)

    async def unloaded() -> bool:
        return (await worker_index(client, worker["url"])).get("acc") in (None, "UNAVAILABLE")

    await eventually(unloaded, "the model unloaded once its last sequence ended", platform)
    # A request that continues the ended sequence is told to start it again, by the worker
    # the activation brings the model back to.
    status, payload = await step(client, platform.public, "s1", 1)
    assert status == 400
    assert "must specify the START flag" in payload["error"]
