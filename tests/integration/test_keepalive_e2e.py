"""The adaptive keep-alive policy through ``zeroserve up``: a periodic client finds its model
pre-warmed, an irregular one leaves no idle replica beyond its ``idle_timeout_s``.

Periods of seconds keep it short; the policy is told to trust a history of 3 idle times
(``ZEROSERVE_CONTROL_PLANE_KEEPALIVE_MIN_IDLE_TIMES``) instead of 10. Nothing asserts a
duration: what is checked is which activations happened and the usage the platform reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_platform_e2e import (
    AUTH,
    SIZES,
    Platform,
    admin_get,
    assert_mlp_answer,
    eventually,
    infer,
    mlp_input,
    platform_factory,  # noqa: F401 (a fixture)
)
from tests.models import write_onnx_mlp

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

PERIOD_S = 8.0
PERIODIC_CALLS = 6
IRREGULAR_GAPS_S = (0.5, 4.0, 1.0, 6.0, 0.2)
BOUND_S = 2.0


async def _register(
    client: httpx.AsyncClient, platform: Platform, model_dir: Path, **scaling: Any
) -> None:
    body = {
        "name": model_dir.name,
        "storage_uri": str(model_dir),
        "scaling": {"min_replicas": 0, "policy": "adaptive", **scaling},
    }
    response = await client.post(f"{platform.admin}/admin/v1/models", json=body, headers=AUTH)
    assert response.status_code == 201, response.text


async def test_periodic_client_is_prewarmed_and_irregular_one_stays_in_bound(
    platform_factory: Callable[..., Platform],  # noqa: F811
    tmp_path: Path,
):
    platform = platform_factory(
        "keepalive",
        "--warm-workers",
        "1",
        ZEROSERVE_CONTROL_PLANE_KEEPALIVE_MIN_IDLE_TIMES="3",
        ZEROSERVE_CONTROL_PLANE_USAGE_FLUSH_S="0",
    )
    periodic = write_onnx_mlp(platform.models_dir, "periodic", SIZES, seed=1)
    irregular = write_onnx_mlp(platform.models_dir, "irregular", SIZES, seed=2)
    async with httpx.AsyncClient(timeout=90.0) as client:
        await _register(client, platform, periodic, idle_timeout_s=60.0)
        await _register(client, platform, irregular, idle_timeout_s=BOUND_S)

        async def call(model_dir: Path, seed: int) -> None:
            x = mlp_input(seed)
            assert_mlp_answer(await infer(client, platform, model_dir.name, x), model_dir, x)

        async def timelines(model: str) -> list[dict[str, Any]]:
            doc = await admin_get(client, platform, f"/models/{model}/activations")
            return list(doc["activations"])  # newest first

        before_last: list[dict[str, Any]] = []

        async def periodic_client() -> None:
            nonlocal before_last
            for i in range(PERIODIC_CALLS):
                if i == PERIODIC_CALLS - 1:
                    before_last = await timelines("periodic")
                await call(periodic, i)
                if i < PERIODIC_CALLS - 1:
                    await asyncio.sleep(PERIOD_S)

        async def irregular_client() -> None:
            for i, gap in enumerate(IRREGULAR_GAPS_S):
                await call(irregular, 100 + i)
                await asyncio.sleep(gap)
            await call(irregular, 200)

        await asyncio.gather(periodic_client(), irregular_client())

        after = await timelines("periodic")
        triggers = [t["trigger"] for t in reversed(after)]  # oldest first
        # The first call is a cold start. Once the history is trusted the model is unloaded
        # between calls and pre-warmed before the next: the last call found it pre-warmed
        # (loaded, or loading, which it joined) and started no activation of its own.
        assert triggers[0] == "request"
        new = after[: len(after) - len(before_last)]
        assert after[0]["trigger"] == "prewarm", (triggers, platform.log()[-5000:])
        assert [t["trigger"] for t in new] in ([], ["prewarm"]), triggers
        assert all(t["outcome"] in ("ready", "revived") for t in after), after

        async def irregular_unloaded() -> bool:
            status = (await admin_get(client, platform, "/models/irregular"))["status"]
            return bool(status["state"] == "scaled_to_zero")

        await eventually(irregular_unloaded, "the irregular model to unload", platform)
        used = await admin_get(client, platform, "/models/irregular/usage")
        # Each idle period ends by its bound (plus a reaper sweep and the unload's drain).
        idle_periods = len(IRREGULAR_GAPS_S) + 1
        assert 0 < used["replica_seconds"]["idle"] <= idle_periods * (BOUND_S + 1.5)
        assert used["cold_starts"] >= 1
        periodic_usage = await admin_get(client, platform, "/models/periodic/usage")
        assert periodic_usage["activations"] == len(after)
        assert periodic_usage["cold_starts"] == triggers.count("request")
