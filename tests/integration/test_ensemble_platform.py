"""An ensemble through ``zeroserve up``: registered with its composing models, activated
from zero by a request to the activator, placed with its parts on one worker, unloaded
with them when idle, and activated again. A real platform process, real workers, the
models of ``tests.data_plane.ensemble.models``; no duration is asserted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from google.protobuf import json_format

from tests.data_plane.ensemble.models import PIXELS, classify_reference, write_repository
from tests.integration.test_platform_e2e import (
    AUTH,
    Platform,
    admin_get,
    client,
    eventually,
    platform_factory,
)
from tests.models import read_config

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

__all__ = ["client", "platform_factory"]  # fixtures used by this module's tests

PARTS = ("pre", "mlp", "post")


async def register(
    client: httpx.AsyncClient, at: Platform, model_dir: Path, **fields: Any
) -> httpx.Response:
    body = {"name": model_dir.name, "storage_uri": str(model_dir), **fields}
    return await client.post(f"{at.admin}/admin/v1/models", json=body, headers=AUTH)


async def worker_index(client: httpx.AsyncClient, url: str) -> dict[str, str]:
    rows = (await client.post(f"{url}/v2/repository/index")).json()
    return {row["name"]: row["state"] for row in rows if "state" in row}


async def test_an_ensemble_is_activated_placed_and_unloaded_with_its_parts(
    platform_factory, client: httpx.AsyncClient
):
    # A long grace period keeps the idle worker up, so that its index can be read.
    platform = platform_factory("ensemble", ZEROSERVE_CONTROL_PLANE_POOL_GRACE_PERIOD_S="600")
    repo = write_repository(platform.models_dir)
    for part in PARTS:
        response = await register(client, platform, repo / part, scaling={"min_replicas": 0})
        assert response.status_code == 201, response.text
    without_config = await register(client, platform, repo / "classify", platform="ensemble")
    assert without_config.status_code == 422
    assert "ensemble_scheduling" in without_config.text
    config = json_format.MessageToDict(
        read_config(repo / "classify"), preserving_proto_field_name=True
    )
    registered = await register(
        client,
        platform,
        repo / "classify",
        config=config,
        scaling={"min_replicas": 0, "idle_timeout_s": 1.0},
    )
    assert registered.status_code == 201, registered.text

    image = np.random.default_rng(3).integers(0, 256, size=(2, PIXELS), dtype=np.uint8)
    body = {
        "inputs": [
            {
                "name": "IMAGE",
                "datatype": "UINT8",
                "shape": [2, PIXELS],
                "data": image.ravel().tolist(),
            }
        ]
    }
    answer = await client.post(f"{platform.public}/v2/models/classify/infer", json=body)

    assert answer.status_code == 200, answer.text
    labels, probabilities = classify_reference(repo, image)
    outputs = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in answer.json()["outputs"]}
    np.testing.assert_array_equal(outputs["LABEL"], labels)
    np.testing.assert_allclose(outputs["PROB"], probabilities, rtol=1e-5, atol=1e-6)
    (worker,) = (await admin_get(client, platform, "/workers"))["workers"]
    assert worker["models"] == ["classify"]
    index = await worker_index(client, worker["url"])
    assert {index[name] for name in ("classify", *PARTS)} == {"READY"}

    async def unloaded_together() -> bool:
        states = await worker_index(client, worker["url"])
        # An unloaded model that is not in the worker's own repository leaves its index.
        return all(states.get(name) in (None, "UNAVAILABLE") for name in ("classify", *PARTS))

    await eventually(unloaded_together, "the ensemble and its parts unloaded when idle", platform)
    assert (await admin_get(client, platform, "/workers"))["workers"][0]["models"] == []

    again = await client.post(f"{platform.public}/v2/models/classify/infer", json=body)
    assert again.status_code == 200, again.text
