"""What the SQLite store adds to the contract: what it keeps across a reopen and what it does
not, the file it writes, and the files it refuses."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from control_plane.store.errors import StoreUnavailableError
from control_plane.store.factory import open_state_store
from control_plane.store.sqlite import SCHEMA_VERSION, SqliteStateStore, sqlite_path
from tests.control_plane.store.test_contract import model, placement, report, worker

pytestmark = pytest.mark.anyio


async def test_registrations_and_activations_outlive_the_store_and_live_state_does_not(
    tmp_path: Path,
):
    path = tmp_path / "state.db"
    first = SqliteStateStore(path)
    await first.create_model(model("mlp"))
    await first.create_model(model("other", generation=5))
    await first.add_activation("mlp", {"id": "a1", "phase": "queued"}, keep=3)
    await first.add_activation("mlp", {"id": "a2", "phase": "queued"}, keep=3)
    assert await first.update_activation("mlp", {"id": "a1", "phase": "ready"})
    await first.put_worker(worker("w1"))
    await first.add_placement(placement("mlp", "w1"))
    await first.report_traffic(report("mlp"))
    assert await first.try_acquire_lease("cp-1", ttl_s=60)
    await first.close()

    second = SqliteStateStore(path)
    try:
        assert await second.list_models() == [model("mlp"), model("other", generation=5)]
        assert await second.list_activations("mlp") == [
            {"id": "a2", "phase": "queued"},
            {"id": "a1", "phase": "ready"},
        ]
        # The workers of the embedded platform end with it: none is read back.
        assert await second.list_workers() == []
        assert await second.list_placements() == []
        assert await second.traffic("mlp") == []
        assert await second.try_acquire_lease("cp-2", ttl_s=60)
    finally:
        await second.close()


async def test_the_file_is_private_in_wal_mode_and_passes_its_integrity_check(tmp_path: Path):
    path = tmp_path / "new-folder" / "state.db"
    store = SqliteStateStore(path)
    await store.create_model(model())
    await store.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        db.close()


async def test_a_second_store_on_a_file_in_use_is_refused_until_the_first_closes(
    tmp_path: Path,
):
    path = tmp_path / "state.db"
    first = SqliteStateStore(path)
    await first.open()
    second = SqliteStateStore(path)
    try:
        with pytest.raises(StoreUnavailableError, match="another zeroserve") as caught:
            await second.open()
        assert caught.value.operation == "open"
        await first.create_model(model())
        await first.close()
        assert await second.list_models() == [model()]
    finally:
        await first.close()
        await second.close()


async def test_a_file_from_a_newer_zeroserve_is_refused_untouched(tmp_path: Path):
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    store = SqliteStateStore(path)
    try:
        with pytest.raises(StoreUnavailableError, match="newer zeroserve"):
            await store.list_models()
    finally:
        await store.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == []
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    finally:
        db.close()


async def test_a_path_that_cannot_be_a_file_is_a_store_failure(tmp_path: Path):
    (tmp_path / "taken").write_text("a file where the folder should be")
    store = SqliteStateStore(tmp_path / "taken" / "state.db")
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            await store.create_model(model())
        assert caught.value.operation == "create_model"
        assert caught.value.store == f"sqlite:///{tmp_path / 'taken' / 'state.db'}"
    finally:
        await store.close()


async def test_a_failed_transaction_leaves_nothing_behind(tmp_path: Path):
    store = SqliteStateStore(tmp_path / "state.db")
    try:
        await store.create_model(model("mlp"))
        await store.add_activation("mlp", {"id": "a1"}, keep=2)
        with pytest.raises(ValueError, match="keep"):
            await store.add_activation("mlp", {"id": "a2"}, keep=0)
        assert await store.list_activations("mlp") == [{"id": "a1"}]
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("url", "path"),
    [
        pytest.param("sqlite:///state.db", Path("state.db"), id="relative"),
        pytest.param("sqlite:////var/lib/zs/state.db", Path("/var/lib/zs/state.db"), id="abs"),
    ],
)
async def test_the_factory_opens_the_file_the_url_names(url: str, path: Path):
    assert sqlite_path(url) == path
    store = open_state_store(url)
    assert isinstance(store, SqliteStateStore)
    await store.close()


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://host/state.db", "sqlite:state.db"])
def test_a_sqlite_url_without_a_path_is_refused(url: str):
    with pytest.raises(ValueError, match="sqlite:///PATH"):
        open_state_store(url)
