"""The admin API of a real ``zeroserve up`` with real workers: what a registration accepts
is what a worker loads, and what the cold-start timeline reports is what the worker did."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

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
    register,
    start_platform,
)
from tests.models import write_onnx_mlp, write_python_model

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    tmp_path = tmp_path_factory.mktemp("admin")
    running = start_platform(tmp_path, "admin")
    yield running
    running.stop()
    leftovers = running.wait_workers_gone()
    running.kill_leftovers()
    assert not leftovers, f"orphan workers {leftovers}"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=90.0) as http:
        yield http


async def test_a_local_folder_activation_says_local(platform: Platform, client: httpx.AsyncClient):
    model_dir = write_onnx_mlp(platform.models_dir, "from-folder", SIZES, seed=11)
    await register(client, platform, model_dir)
    x = mlp_input(11)
    assert_mlp_answer(await infer(client, platform, "from-folder", x), model_dir, x)
    (timeline,) = (await admin_get(client, platform, "/models/from-folder/activations"))[
        "activations"
    ]
    assert timeline["outcome"] == "ready"
    assert timeline["cache"] == "local"
    assert timeline["bytes_fetched"] == 0
    assert "fetched" in [p["phase"] for p in timeline["phases"]]


async def test_a_dotted_name_loads_and_serves(platform: Platform, client: httpx.AsyncClient):
    model_dir = write_onnx_mlp(platform.models_dir, "mlp.v1", SIZES, seed=12)
    await register(client, platform, model_dir)
    x = mlp_input(12)
    assert_mlp_answer(await infer(client, platform, "mlp.v1", x), model_dir, x)
    (timeline,) = (await admin_get(client, platform, "/models/mlp.v1/activations"))["activations"]
    assert timeline["outcome"] == "ready"


async def test_a_name_no_worker_could_load_is_refused_at_registration(
    platform: Platform, client: httpx.AsyncClient
):
    model_dir = write_onnx_mlp(platform.models_dir, "plain", SIZES, seed=13)
    refused = ("a?b", "a#b", "a%2Fb", "a b", "a\x01b", "x" * 255)
    for name in refused:
        response = await client.post(
            f"{platform.admin}/admin/v1/models",
            json={"name": name, "storage_uri": str(model_dir)},
            headers=AUTH,
        )
        assert response.status_code == 422, (name, response.text)
        assert response.json()["fields"] == ["name"]
    listed = {m["name"] for m in (await admin_get(client, platform, "/models"))["models"]}
    assert not listed & set(refused)


async def test_a_folder_registered_under_another_name_is_served_under_it(
    platform: Platform, client: httpx.AsyncClient
):
    # The folder and its config.pbtxt say "exported"; the registration's name wins.
    model_dir = write_onnx_mlp(platform.models_dir, "exported", SIZES, seed=14)
    response = await client.post(
        f"{platform.admin}/admin/v1/models",
        json={"name": "served-as", "storage_uri": str(model_dir)},
        headers=AUTH,
    )
    assert response.status_code == 201, response.text
    x = mlp_input(14)
    assert_mlp_answer(await infer(client, platform, "served-as", x), model_dir, x)


async def test_up_registers_model_code_unless_its_operator_says_no(
    platform: Platform, client: httpx.AsyncClient, tmp_path: Path
):
    # A real Python model: the registration is checked against what its folder holds.
    model_dir = write_python_model(platform.models_dir, "code")
    body = {"name": "code", "storage_uri": str(model_dir), "backend": "python"}
    allowed = await client.post(f"{platform.admin}/admin/v1/models", json=body, headers=AUTH)
    assert allowed.status_code == 201, allowed.text
    refusing = start_platform(tmp_path, "no-code", ZEROSERVE_CONTROL_PLANE_ALLOW_MODEL_CODE="false")
    try:
        body["storage_uri"] = str(refusing.models_dir)
        refused = await client.post(f"{refusing.admin}/admin/v1/models", json=body, headers=AUTH)
        assert refused.status_code == 422, refused.text
        assert "ZEROSERVE_CONTROL_PLANE_ALLOW_MODEL_CODE" in refused.json()["error"]
    finally:
        refusing.stop()
        leftovers = refusing.wait_workers_gone()
        refusing.kill_leftovers()
    assert not leftovers


async def test_one_warm_worker_stays_while_a_model_is_loaded_and_unloaded(
    client: httpx.AsyncClient, tmp_path: Path
):
    """Real processes, the reaper sweeping every 0.2 s: the warm worker a model takes gets
    one replacement; once the model is unloaded, the pool has one empty worker too many, and
    loading the model again within the grace period starts and stops nothing. (The
    replacement, empty for longer than the grace period, used to be stopped at the first
    sweep after the unload, and another started at the next load.)"""
    grace_s = 10.0
    running = start_platform(
        tmp_path,
        "warm",
        ZEROSERVE_CONTROL_PLANE_WARM_WORKERS="1",
        ZEROSERVE_CONTROL_PLANE_POOL_GRACE_PERIOD_S=str(grace_s),
    )
    try:
        model_dir = write_onnx_mlp(running.models_dir, "comes-and-goes", SIZES, seed=15)
        await register(client, running, model_dir)
        seen: set[str] = set()

        async def count_is(n: int) -> bool:
            listed = (await admin_get(client, running, "/workers"))["workers"]
            seen.update(w["id"] for w in listed)
            return len(listed) == n

        async def admin(action: str) -> None:
            url = f"{running.admin}/admin/v1/models/comes-and-goes/{action}"
            response = await client.post(url, headers=AUTH)
            assert response.status_code == 200, response.text

        await eventually(lambda: count_is(1), "the warm worker", running)
        await admin("load")
        await eventually(lambda: count_is(2), "a replacement warm worker", running)
        await asyncio.sleep(grace_s + 1)  # the replacement has been empty past the grace
        for _ in range(3):
            await admin("unload")
            await asyncio.sleep(1.0)  # five sweeps with one empty worker too many
            assert await count_is(2)
            await admin("load")
            assert await count_is(2)
        assert len(seen) == 2, seen
    finally:
        running.stop()
        leftovers = running.wait_workers_gone()
        running.kill_leftovers()
    assert not leftovers
