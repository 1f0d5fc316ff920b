"""``zeroserve up``'s state on disk: what survives a stop and start, and a ``kill -9``.

Real platforms (``python -m zeroserve.cli up``) on free loopback ports, as in
``test_platform_e2e``; the SQLite file is then opened as any SQLite reader would open it.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from control_plane.store.sqlite import SqliteStateStore
from foundation.records import ModelRecord
from tests.integration.test_platform_e2e import (
    AUTH,
    SIZES,
    Platform,
    admin_get,
    assert_mlp_answer,
    eventually,
    infer,
    infer_body,
    mlp_input,
    register,
    start_platform,
)
from tests.models import write_onnx_mlp

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

BURST = 400
"""Registrations sent in the burst that the kill interrupts."""
BURST_CONCURRENCY = 16
KILL_AFTER = 25
"""Registrations answered 201 before the platform is killed."""


@pytest.fixture
def platforms(tmp_path: Path) -> Iterator[Callable[..., Platform]]:
    """Start platforms in this test's folder; each is stopped at teardown and its workers
    are checked gone. Platforms of one name share their data folder (their default state)."""
    started: list[Platform] = []

    def start(name: str, *args: str, **env: Any) -> Platform:
        platform = start_platform(tmp_path, name, *args, **env)
        started.append(platform)
        return platform

    yield start
    for platform in started:
        platform.stop()
        leftovers = platform.wait_workers_gone()
        platform.kill_leftovers()
        assert not leftovers, f"orphan workers {leftovers}:\n{platform.log()}"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=90.0, limits=limits) as http:
        yield http


async def test_registrations_and_activation_history_survive_a_restart(
    tmp_path: Path, platforms: Callable[..., Platform], client: httpx.AsyncClient
):
    first = platforms("kept")
    default_file = tmp_path / "kept-data" / "zeroserve" / "state.db"
    assert f"state sqlite:///{default_file}" in first.log()
    model_dir = write_onnx_mlp(first.models_dir, "kept", SIZES, seed=3)
    await register(client, first, model_dir)
    x = mlp_input(3)
    assert_mlp_answer(await infer(client, first, "kept", x), model_dir, x)
    timelines: list[dict[str, Any]] = []

    async def answered() -> bool:
        # The timeline's last change (the first response) comes after the answer.
        nonlocal timelines
        timelines = (await admin_get(client, first, "/models/kept/activations"))["activations"]
        return len(timelines) == 1 and "first_response" in timelines[0]["durations_s"]

    await eventually(answered, "the cold start's timeline", first)
    registered = await admin_get(client, first, "/models/kept")
    assert first.stop() == 0, first.log()
    assert first.wait_workers_gone() == set()

    second = platforms("kept")
    restored = await admin_get(client, second, "/models/kept")
    assert restored["name"] == registered["name"] == "kept"
    assert restored["storage_uri"] == registered["storage_uri"]
    assert restored["generation"] == registered["generation"]
    activations = await admin_get(client, second, "/models/kept/activations")
    assert activations["activations"] == timelines
    # Nothing of the first platform's workers is believed: the model starts again from zero.
    assert_mlp_answer(await infer(client, second, "kept", x), model_dir, x)


async def test_keys_and_their_revocations_survive_a_restart(
    tmp_path: Path, platforms: Callable[..., Platform], client: httpx.AsyncClient
):
    keyed = {"ZEROSERVE_ACTIVATOR_AUTH": "keys"}
    first = platforms("keyed", **keyed)
    model_dir = write_onnx_mlp(first.models_dir, "guarded", SIZES, seed=5)
    await register(client, first, model_dir)
    made = {}
    for name in ("kept", "revoked"):
        response = await client.post(
            f"{first.admin}/admin/v1/keys",
            json={"name": name, "models": ["guarded"]},
            headers=AUTH,
        )
        assert response.status_code == 201, response.text
        made[name] = response.json()
    revoked = await client.post(
        f"{first.admin}/admin/v1/keys/{made['revoked']['id']}/revoke", headers=AUTH
    )
    assert revoked.status_code == 200, revoked.text
    x = mlp_input(5)

    async def call(platform: Platform, key: str) -> httpx.Response:
        return await client.post(
            f"{platform.public}/v2/models/guarded/infer",
            json=infer_body(x),
            headers={"Authorization": f"Bearer {key}"},
        )

    assert_mlp_answer(await call(first, made["kept"]["key"]), model_dir, x)
    assert first.stop() == 0, first.log()

    second = platforms("keyed", **keyed)
    listed = {key["id"]: key for key in (await admin_get(client, second, "/keys"))["keys"]}
    assert set(listed) == {made["kept"]["id"], made["revoked"]["id"]}
    assert listed[made["revoked"]["id"]]["state"] == "revoked"
    assert listed[made["kept"]["id"]]["state"] == "active"
    assert_mlp_answer(await call(second, made["kept"]["key"]), model_dir, x)
    assert (await call(second, made["revoked"]["key"])).status_code == 401
    # The state file (and its write-ahead log) holds the keys' hashes, never a key.
    folder = tmp_path / "keyed-data" / "zeroserve"
    stored = b"".join(path.read_bytes() for path in folder.glob("state.db*"))
    assert made["kept"]["id"].encode() in stored
    for name in ("kept", "revoked"):
        secret = made[name]["key"].rsplit("_", 1)[1]
        assert secret.encode() not in stored
        assert made[name]["key"] not in first.log() + second.log()


async def test_memory_state_is_forgotten_on_restart(
    platforms: Callable[..., Platform], client: httpx.AsyncClient
):
    first = platforms("forgetful", "--state", "memory")
    assert "state memory" in first.log()
    await register(client, first, write_onnx_mlp(first.models_dir, "gone", SIZES))
    assert first.stop() == 0, first.log()
    second = platforms("forgetful", "--state", "memory")
    assert (await admin_get(client, second, "/models"))["models"] == []


async def test_kill_9_during_a_burst_of_registrations_leaves_only_whole_records(
    tmp_path: Path, platforms: Callable[..., Platform], client: httpx.AsyncClient
):
    state = tmp_path / "burst-state.db"
    platform = platforms("killed", "--state", f"sqlite:///{state}")
    model_dir = write_onnx_mlp(platform.models_dir, "shared", SIZES)
    platform.remember_workers()
    acked: list[str] = []
    enough = asyncio.Event()
    slots = asyncio.Semaphore(BURST_CONCURRENCY)

    async def register_one(index: int) -> None:
        name = f"m{index:04d}"
        body = {
            "name": name,
            "storage_uri": str(model_dir),
            "scaling": {"min_replicas": 0, "idle_timeout_s": 30.0 + index},
        }
        async with slots:
            try:
                response = await client.post(
                    f"{platform.admin}/admin/v1/models", json=body, headers=AUTH
                )
            except httpx.TransportError:
                return  # sent when the platform died, or after
        if response.status_code == 201:
            acked.append(name)
            if len(acked) >= KILL_AFTER:
                enough.set()

    burst = [asyncio.create_task(register_one(i)) for i in range(BURST)]
    try:
        async with asyncio.timeout(120):
            await enough.wait()
        platform.stop(signal.SIGKILL)
    finally:
        await asyncio.gather(*burst)
    assert platform.process.returncode == -signal.SIGKILL
    assert platform.wait_workers_gone() == set()
    assert KILL_AFTER <= len(acked) < BURST, "the kill did not fall within the burst"

    db = sqlite3.connect(state)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        rows = db.execute("SELECT kind, id, body FROM records").fetchall()
    finally:
        db.close()
    stored = {}
    for kind, name, body in rows:
        assert kind == "model"
        record = ModelRecord.from_json(orjson.loads(body))
        assert record.name == name
        assert record.storage_uri == str(model_dir)
        # Each record is the one its request sent, not a mix of two.
        assert record.scaling.idle_timeout_s == 30.0 + int(name[1:])
        stored[name] = record
    # Answered 201 means on disk: every acknowledged registration is there.
    assert set(acked) <= set(stored)

    # And the store reads its own file back after the crash.
    store = SqliteStateStore(state)
    try:
        assert [r.name for r in await store.list_models()] == sorted(stored)
    finally:
        await store.close()
