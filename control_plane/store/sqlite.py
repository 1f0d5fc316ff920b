"""The state store for the embedded platform that keeps what matters across a restart.

What outlives the process (registrations, activation history) is kept in one SQLite file,
in WAL mode, every write one transaction: a crash (even ``kill -9``) between two writes
leaves the file as it was after the first, never with half a record. What describes the
running processes (workers, placements, sleeping replicas, traffic, activation requests,
first responses, the lease) is kept in memory, by a :class:`MemoryStateStore`: the workers
of the embedded platform are its own children and end with it, so placements read back
after a restart would route to processes that no longer exist. Subscriptions are that
store's, in process, since the embedded platform is one process.

Records are JSON documents keyed by (kind, id) in one table, so a new kind of durable record
is a few lines over :meth:`SqliteStateStore._insert` and its siblings, not a new table.

sqlite3 blocks, so every statement runs on one thread of the store's own; the event loop
only awaits it. One thread is also what serialises the writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import orjson

from control_plane.store.base import StateStore, StoreConflictError
from control_plane.store.errors import StoreUnavailableError
from control_plane.store.memory import MemoryStateStore
from foundation.keys import ApiKeyRecord
from foundation.records import (
    FirstResponse,
    ModelRecord,
    Placement,
    PlacementEvent,
    TrafficReport,
    WorkerRecord,
)

__all__ = ["SCHEMA_VERSION", "SqliteStateStore", "sqlite_path"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

SCHEMA_VERSION = 1
"""``PRAGMA user_version`` of the files this code writes; a newer file is refused."""

_MODEL = "model"
"""The kind of a model registration in the ``records`` table."""
_KEY = "key"
"""The kind of an API key (its public id, hash and scope; never the key) in ``records``."""

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS records (kind TEXT NOT NULL, id TEXT NOT NULL, "
    "body BLOB NOT NULL, PRIMARY KEY (kind, id)) WITHOUT ROWID",
    # seq orders the timelines; AUTOINCREMENT so that a trimmed one's number never returns.
    "CREATE TABLE IF NOT EXISTS activations (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "model TEXT NOT NULL, timeline_id TEXT, body BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS activations_by_model ON activations (model, seq)",
    # What the control plane learns per model (idle-time histograms, usage ledgers).
    "CREATE TABLE IF NOT EXISTS model_state (model TEXT NOT NULL, key TEXT NOT NULL, "
    "body BLOB NOT NULL, PRIMARY KEY (model, key)) WITHOUT ROWID",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)


def sqlite_path(url: str) -> Path:
    """The file a ``sqlite:///PATH`` URL names (``sqlite:///state.db`` is relative to the
    current folder, ``sqlite:////var/lib/zs/state.db`` absolute, as SQLAlchemy reads them).

    Raises ValueError for another scheme or an empty path."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ValueError("a SQLite state store URL is sqlite:///PATH (sqlite:////abs/path.db)")
    return Path(url[len(prefix) :])


class SqliteStateStore(StateStore):
    """A :class:`StateStore` whose registrations and activation history live in a SQLite file.

    Opens the file lazily, on the first call, creating it (mode 0600: it will hold key
    hashes) and its folder (0700) when missing. The file is locked for this store alone
    (SQLite's exclusive locking mode): a second platform on the same file gets
    StoreUnavailableError on its first call instead of a second, diverging set of workers.

    Every call is bounded by ``timeout_s`` and raises StoreUnavailableError past it or when
    the file cannot be opened or written; a write that timed out may still land, as with
    Redis. Calls after :meth:`close` raise StoreUnavailableError too.

    Parameters:
        path: the database file.
        timeout_s: the longest one call may wait for the database thread.
        subscriber_queue_max, traffic_ttl_s, activation_pending_ttl_s, clock: the in-memory
            part's (see :class:`MemoryStateStore`).
    """

    def __init__(
        self,
        path: Path,
        *,
        timeout_s: float = 10.0,
        subscriber_queue_max: int = 1024,
        traffic_ttl_s: float = 30.0,
        activation_pending_ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._path = path
        self._timeout_s = timeout_s
        self._live = MemoryStateStore(
            subscriber_queue_max=subscriber_queue_max,
            traffic_ttl_s=traffic_ttl_s,
            activation_pending_ttl_s=activation_pending_ttl_s,
            clock=clock,
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        # Touched only on the executor's thread.
        self._connection: sqlite3.Connection | None = None
        self._closed = False

    async def open(self) -> None:
        """Open the file now rather than on the first call, so that a file that cannot be
        used (locked by another platform, unwritable, from a newer zeroserve) stops a
        platform before it starts anything. Raises StoreUnavailableError."""
        await self._run("open", lambda db: None)

    # ---- models ----
    async def create_model(self, record: ModelRecord) -> None:
        if not await self._insert(_MODEL, record.name, record.to_json(), "create_model"):
            raise StoreConflictError(f"model {record.name!r} already exists")

    async def update_model(
        self, record: ModelRecord, *, expected_generation: int | None = None
    ) -> None:
        body = orjson.dumps(record.to_json())

        def update(db: sqlite3.Connection) -> str | None:
            # Read and write in one transaction, so that the generation compared is the one
            # replaced (a change between the two would otherwise be undone).
            with _transaction(db):
                row = db.execute(
                    "SELECT body FROM records WHERE kind = ? AND id = ?", (_MODEL, record.name)
                ).fetchone()
                if row is None:
                    return "does not exist"
                stored = _document(bytes(row[0])).get("generation")
                if expected_generation is not None and stored != expected_generation:
                    return f"does not exist at generation {expected_generation}"
                db.execute(
                    "UPDATE records SET body = ? WHERE kind = ? AND id = ?",
                    (body, _MODEL, record.name),
                )
                return None

        refused = await self._run("update_model", update)
        if refused is not None:
            raise StoreConflictError(f"model {record.name!r} {refused}")

    async def get_model(self, name: str) -> ModelRecord | None:
        doc = await self._get(_MODEL, name, "get_model")
        return None if doc is None else ModelRecord.from_json(doc)

    async def list_models(self) -> list[ModelRecord]:
        return [ModelRecord.from_json(doc) for doc in await self._list(_MODEL, "list_models")]

    async def delete_model(self, name: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                gone = db.execute("DELETE FROM records WHERE kind = ? AND id = ?", (_MODEL, name))
                db.execute("DELETE FROM activations WHERE model = ?", (name,))
                db.execute("DELETE FROM model_state WHERE model = ?", (name,))
                return gone.rowcount > 0

        existed = await self._run("delete_model", delete)
        # The live part too, even when the record was already gone (see MemoryStateStore).
        await self._live.delete_model(name)
        return existed

    # ---- activation timelines ----
    async def add_activation(self, model: str, timeline: dict[str, Any], *, keep: int) -> None:
        """Append a cold-start timeline, keeping the newest ``keep`` (>= 1, else ValueError)."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        body = orjson.dumps(timeline)
        timeline_id = timeline.get("id")
        kept_id = timeline_id if isinstance(timeline_id, str) else None

        def add(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute(
                    "INSERT INTO activations (model, timeline_id, body) VALUES (?, ?, ?)",
                    (model, kept_id, body),
                )
                db.execute(
                    "DELETE FROM activations WHERE model = ? AND seq NOT IN "
                    "(SELECT seq FROM activations WHERE model = ? ORDER BY seq DESC LIMIT ?)",
                    (model, model, keep),
                )

        await self._run("add_activation", add)

    async def update_activation(self, model: str, timeline: dict[str, Any]) -> bool:
        timeline_id = timeline.get("id")
        if not isinstance(timeline_id, str):
            raise ValueError(f"a timeline to update needs a str id, got {timeline_id!r}")
        body = orjson.dumps(timeline)

        def update(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                # The newest of that id, should a caller have added one id twice.
                changed = db.execute(
                    "UPDATE activations SET body = ? WHERE seq = (SELECT MAX(seq) FROM "
                    "activations WHERE model = ? AND timeline_id = ?)",
                    (body, model, timeline_id),
                )
                return changed.rowcount > 0

        return await self._run("update_activation", update)

    async def list_activations(self, model: str) -> list[dict[str, Any]]:
        def read(db: sqlite3.Connection) -> list[bytes]:
            rows = db.execute(
                "SELECT body FROM activations WHERE model = ? ORDER BY seq DESC", (model,)
            )
            return [row[0] for row in rows]

        return [orjson.loads(raw) for raw in await self._run("list_activations", read)]

    # ---- the live part, in memory ----
    async def put_worker(self, worker: WorkerRecord) -> None:
        await self._live.put_worker(worker)

    async def remove_worker(self, worker_id: str) -> None:
        await self._live.remove_worker(worker_id)

    async def list_workers(self) -> list[WorkerRecord]:
        return await self._live.list_workers()

    async def add_placement(self, placement: Placement) -> None:
        await self._live.add_placement(placement)

    async def remove_placement(self, model: str, worker_id: str) -> None:
        await self._live.remove_placement(model, worker_id)

    async def list_placements(self, model: str | None = None) -> list[Placement]:
        return await self._live.list_placements(model)

    def subscribe_placements(self) -> AsyncIterator[PlacementEvent]:
        return self._live.subscribe_placements()

    async def put_sleeping(self, replica: Placement) -> None:
        await self._live.put_sleeping(replica)

    async def remove_sleeping(self, model: str, worker_id: str) -> bool:
        return await self._live.remove_sleeping(model, worker_id)

    async def list_sleeping(self, model: str | None = None) -> list[Placement]:
        return await self._live.list_sleeping(model)

    async def request_activation(self, model: str) -> None:
        await self._live.request_activation(model)

    def subscribe_activation_requests(self) -> AsyncIterator[str]:
        return self._live.subscribe_activation_requests()

    async def report_first_response(self, report: FirstResponse) -> None:
        await self._live.report_first_response(report)

    def subscribe_first_responses(self) -> AsyncIterator[FirstResponse]:
        return self._live.subscribe_first_responses()

    async def report_traffic(self, report: TrafficReport) -> None:
        await self._live.report_traffic(report)

    async def traffic(self, model: str) -> list[TrafficReport]:
        return await self._live.traffic(model)

    # ---- per-model control state ----
    async def put_model_state(self, model: str, key: str, doc: dict[str, Any]) -> None:
        body = orjson.dumps(doc)

        def put(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute(
                    "INSERT OR REPLACE INTO model_state (model, key, body) VALUES (?, ?, ?)",
                    (model, key, body),
                )

        await self._run("put_model_state", put)

    async def get_model_state(self, model: str, key: str) -> dict[str, Any] | None:
        def read(db: sqlite3.Connection) -> bytes | None:
            row = db.execute(
                "SELECT body FROM model_state WHERE model = ? AND key = ?", (model, key)
            ).fetchone()
            return None if row is None else bytes(row[0])

        raw = await self._run("get_model_state", read)
        return None if raw is None else _document(raw)

    # ---- API keys (kept in the file; revocations told through the live part) ----
    async def create_key(self, record: ApiKeyRecord) -> None:
        if not await self._insert(_KEY, record.id, record.to_json(), "create_key"):
            raise StoreConflictError(f"key {record.id!r} already exists")

    async def get_key(self, key_id: str) -> ApiKeyRecord | None:
        doc = await self._get(_KEY, key_id, "get_key")
        return None if doc is None else ApiKeyRecord.from_json(doc)

    async def list_keys(self) -> list[ApiKeyRecord]:
        return [ApiKeyRecord.from_json(doc) for doc in await self._list(_KEY, "list_keys")]

    async def revoke_key(self, key_id: str, *, revoked_at: float) -> ApiKeyRecord | None:
        def revoke(db: sqlite3.Connection) -> dict[str, Any] | None:
            with _transaction(db):
                row = db.execute(
                    "SELECT body FROM records WHERE kind = ? AND id = ?", (_KEY, key_id)
                ).fetchone()
                if row is None:
                    return None
                doc = _document(bytes(row[0]))
                # A key revoked before keeps its first revocation time.
                if doc.get("revoked_at") is None:
                    doc["revoked_at"] = revoked_at
                    db.execute(
                        "UPDATE records SET body = ? WHERE kind = ? AND id = ?",
                        (orjson.dumps(doc), _KEY, key_id),
                    )
                return doc

        doc = await self._run("revoke_key", revoke)
        if doc is None:
            return None
        record = ApiKeyRecord.from_json(doc)
        # The live part publishes revocations of the keys it holds: give it this one (it may
        # have been created before a restart), then revoke it there to tell subscribers.
        with contextlib.suppress(StoreConflictError):
            await self._live.create_key(record)
        await self._live.revoke_key(key_id, revoked_at=revoked_at)
        return record

    def subscribe_key_revocations(self) -> AsyncIterator[str]:
        return self._live.subscribe_key_revocations()

    async def try_acquire_lease(self, holder: str, ttl_s: float) -> bool:
        return await self._live.try_acquire_lease(holder, ttl_s)

    async def release_lease(self, holder: str) -> None:
        await self._live.release_lease(holder)

    async def close(self) -> None:
        """End every subscription, close the file (its WAL checkpointed into it) and stop
        the database thread; later calls raise StoreUnavailableError. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._live.close()
        loop = asyncio.get_running_loop()
        try:
            # Bounded as every call is: a thread stuck on the disk must not hold shutdown.
            async with asyncio.timeout(self._timeout_s):
                await loop.run_in_executor(self._executor, self._disconnect)
        except TimeoutError:
            logger.warning("state file %s not closed within %s s", self._path, self._timeout_s)
        finally:
            self._executor.shutdown(wait=False)

    # ---- durable records: JSON documents keyed by (kind, id) ----
    async def _insert(self, kind: str, key: str, doc: dict[str, Any], operation: str) -> bool:
        """Store a new record; False (nothing written) when one of that kind and id exists."""
        body = orjson.dumps(doc)

        def insert(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                done = db.execute(
                    "INSERT OR IGNORE INTO records (kind, id, body) VALUES (?, ?, ?)",
                    (kind, key, body),
                )
                return done.rowcount > 0

        return await self._run(operation, insert)

    async def _replace(self, kind: str, key: str, doc: dict[str, Any], operation: str) -> bool:
        """Replace a record; False (nothing written) when none of that kind and id exists."""
        body = orjson.dumps(doc)

        def replace(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                done = db.execute(
                    "UPDATE records SET body = ? WHERE kind = ? AND id = ?", (body, kind, key)
                )
                return done.rowcount > 0

        return await self._run(operation, replace)

    async def _get(self, kind: str, key: str, operation: str) -> dict[str, Any] | None:
        def read(db: sqlite3.Connection) -> bytes | None:
            row = db.execute(
                "SELECT body FROM records WHERE kind = ? AND id = ?", (kind, key)
            ).fetchone()
            return None if row is None else bytes(row[0])

        raw = await self._run(operation, read)
        return None if raw is None else _document(raw)

    async def _list(self, kind: str, operation: str) -> list[dict[str, Any]]:
        """Every record of ``kind``, sorted by id (bytewise, as the other stores sort)."""

        def read(db: sqlite3.Connection) -> list[bytes]:
            rows = db.execute("SELECT body FROM records WHERE kind = ? ORDER BY id", (kind,))
            return [bytes(row[0]) for row in rows]

        return [_document(raw) for raw in await self._run(operation, read)]

    async def _delete(self, kind: str, key: str, operation: str) -> bool:
        """Remove a record; False when there was none."""

        def delete(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                done = db.execute("DELETE FROM records WHERE kind = ? AND id = ?", (kind, key))
                return done.rowcount > 0

        return await self._run(operation, delete)

    # ---- the database thread ----
    async def _run(self, operation: str, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """``work`` on the database thread, bounded by ``timeout_s``; store failures become
        StoreUnavailableError (``ValueError`` and the like, the caller's, pass through)."""
        if self._closed:
            raise self._unavailable(operation, "closed")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout_s):
                return await loop.run_in_executor(self._executor, self._call, work)
        except TimeoutError:
            raise self._unavailable(operation, f"no answer within {self._timeout_s} s") from None
        except (sqlite3.Error, OSError) as exc:
            raise self._unavailable(operation, _reason(exc)) from exc
        except RuntimeError:
            # The executor refuses new work once close() has shut it down.
            if self._closed:
                raise self._unavailable(operation, "closed") from None
            raise

    def _call(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        if self._connection is None:
            self._connection = self._connect()
        return work(self._connection)

    def _connect(self) -> sqlite3.Connection:
        self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Created here rather than by sqlite, whose files take the umask (often 0644).
        os.close(os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600))
        # Autocommit mode: transactions are the explicit BEGIN IMMEDIATE of _transaction.
        db = sqlite3.connect(self._path, isolation_level=None, timeout=0.0)
        try:
            db.execute("PRAGMA locking_mode = EXCLUSIVE")
            # Before anything that writes: a newer file is left as it is.
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise sqlite3.DatabaseError(
                    f"written by a newer zeroserve (schema {version}, this one reads "
                    f"{SCHEMA_VERSION})"
                )
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"cannot use WAL mode (journal mode {mode})")
            # FULL: a registration that was answered 201 is on disk, power loss included.
            db.execute("PRAGMA synchronous = FULL")
            # One transaction, so a crash here leaves no half-made schema; being the first
            # write, it also takes the exclusive lock, held until close.
            with _transaction(db):
                for statement in _SCHEMA:
                    db.execute(statement)
        except BaseException:
            db.close()
            raise
        return db

    def _disconnect(self) -> None:
        db, self._connection = self._connection, None
        if db is not None:
            db.close()

    def _unavailable(self, operation: str, reason: str) -> StoreUnavailableError:
        return StoreUnavailableError(
            store=f"sqlite:///{self._path}", operation=operation, reason=reason
        )


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction: committed when the block ends, rolled back if it raises."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _document(raw: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(raw)
    return doc


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
        return f"{text}: another zeroserve uses this state file"
    return text
