"""The activator's local view of the control plane's state: placements and model names.

:class:`PlacementView` follows the store's placement events into a :class:`ReplicaTable`
and tells a :class:`ReplicaListener` (the buffer) what came and went. :class:`ModelCatalog`
answers "is this model registered?" from a short-lived cache, so that requests for unknown
names are refused without waking anything and known names cost no store round trip.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from activator.errors import CatalogUnavailableError
from activator.lb import Replica, choose
from foundation.records import (
    ModelFailure,
    ModelRecord,
    Placement,
    PlacementEvent,
    PlacementEventKind,
)

logger = logging.getLogger(__name__)

_Endpoint = tuple[str, str]
"""Where a replica answers: the worker's data-plane URL and its gRPC address ("" for none)."""


class PlacementSource(Protocol):
    """Where placements come from (``StateStore`` is one)."""

    def subscribe_placements(self) -> AsyncIterator[PlacementEvent]: ...

    async def list_placements(self, model: str | None = None) -> list[Placement]: ...


class ModelSource(Protocol):
    """Where registered models come from (``StateStore`` is one)."""

    async def get_model(self, name: str) -> ModelRecord | None: ...

    async def list_models(self) -> list[ModelRecord]: ...


class ReplicaListener(Protocol):
    """Told when a model gains or loses a ready replica (the buffer releases on it)."""

    def replica_added(self, model: str, replica: Replica) -> None: ...

    def replica_removed(self, model: str, replica: Replica) -> None: ...


class ReplicaTable:
    """The ready replicas of every model, and the least-outstanding pick among them."""

    def __init__(self) -> None:
        self._by_model: dict[str, list[Replica]] = {}
        self._picks = 0

    def replicas(self, model: str) -> Sequence[Replica]:
        return self._by_model.get(model, ())

    def choose(self, model: str) -> Replica | None:
        """The replica of ``model`` with the fewest requests in flight; None if it has none."""
        replicas = self._by_model.get(model)
        if not replicas:
            return None
        self._picks += 1
        return choose(replicas, offset=self._picks)

    def get(self, model: str, worker_id: str) -> Replica | None:
        for replica in self._by_model.get(model, ()):
            if replica.worker_id == worker_id:
                return replica
        return None

    def add(self, model: str, replica: Replica) -> None:
        self._by_model.setdefault(model, []).append(replica)

    def remove(self, model: str, replica: Replica) -> bool:
        """Drop ``replica``; False if it was not there (removed already)."""
        replicas = self._by_model.get(model)
        if replicas is None or replica not in replicas:
            return False
        replicas.remove(replica)
        if not replicas:
            del self._by_model[model]
        return True

    def models(self) -> list[str]:
        return list(self._by_model)


class PlacementView:
    """Keeps a :class:`ReplicaTable` equal to the store's placements, plus local knowledge.

    Local knowledge is :meth:`forget`: a replica that refused a connection leaves the table
    at once (the store learns of a dead worker only later) and comes back after
    ``quarantine_s`` unless the store removed it meanwhile. Without the return, one refused
    connection to a healthy worker would hide it from this activator until the next resync,
    and its requests would wait for an activation the control plane sees no reason to do.
    And :meth:`suspend`: every replica of a worker that stopped answering leaves the table
    until :meth:`resume` (its liveness probe answers again); the store's events for it are
    kept aside meanwhile, so a resume puts back what the store still places there.

    Parameters:
        source: the placement events and the full list on resync.
        table: the table to keep current; shared with the proxy and the buffer.
        listener: told of every replica added to or removed from the table.
        quarantine_s: how long a forgotten replica stays out.
        resubscribe_delay_s: pause before subscribing again after the subscription failed.
    """

    def __init__(
        self,
        source: PlacementSource,
        table: ReplicaTable,
        listener: ReplicaListener,
        *,
        quarantine_s: float,
        resubscribe_delay_s: float,
    ) -> None:
        self._source = source
        self._table = table
        self._listener = listener
        self._quarantine_s = quarantine_s
        self._resubscribe_delay_s = resubscribe_delay_s
        self._quarantined: dict[tuple[str, str], tuple[_Endpoint, asyncio.TimerHandle]] = {}
        self._suspended: dict[str, dict[str, _Endpoint]] = {}
        """worker id -> {model: endpoint}: the placements of a suspended worker."""
        self._synced = asyncio.Event()

    @property
    def is_synced(self) -> bool:
        """True once the first full list of placements has been applied."""
        return self._synced.is_set()

    async def wait_synced(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the first full list; False if it did not come."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._synced.wait()
        except TimeoutError:
            logger.warning("placements not synced within %.1f s; not ready yet", timeout_s)
            return False
        return True

    async def run(self) -> None:
        """Follow the store's placement events until cancelled, resubscribing on failure."""
        while True:
            try:
                async for event in self._source.subscribe_placements():
                    await self._apply(event)
                logger.warning("placement subscription ended; subscribing again")
            except Exception:
                # The store's iterators survive reconnects themselves, so this is a store
                # outage or a bug: keep serving from the table we have and try again.
                logger.exception("placement subscription failed; subscribing again")
            await asyncio.sleep(self._resubscribe_delay_s)

    def forget(self, model: str, replica: Replica) -> None:
        """Take ``replica`` out of the table for a while: it refused a connection."""
        if not self._table.remove(model, replica):
            return
        logger.warning(
            "replica of %s on worker %s refused a connection; left out for %.1f s",
            model,
            replica.worker_id,
            self._quarantine_s,
            extra={"model": model, "worker_id": replica.worker_id},
        )
        key = (model, replica.worker_id)
        handle = asyncio.get_running_loop().call_later(self._quarantine_s, self._restore, key)
        self._quarantined[key] = ((replica.url, replica.grpc_address), handle)
        self._listener.replica_removed(model, replica)

    def suspend(self, worker_id: str) -> list[str]:
        """Take every replica of ``worker_id`` out of the table until :meth:`resume`; the
        models whose replica left (none if the worker had none, or was suspended)."""
        if worker_id in self._suspended:
            return []
        taken: dict[str, _Endpoint] = {}
        for model in self._table.models():
            replica = self._table.get(model, worker_id)
            if replica is not None:
                self._table.remove(model, replica)
                taken[model] = (replica.url, replica.grpc_address)
                self._listener.replica_removed(model, replica)
        if taken:
            self._suspended[worker_id] = taken
            logger.warning(
                "worker %s stopped answering; its replicas of %s are out of routing",
                worker_id,
                ", ".join(sorted(taken)),
                extra={"worker_id": worker_id},
            )
        return sorted(taken)

    def resume(self, worker_id: str) -> None:
        """Put back the replicas of a suspended ``worker_id`` that the store still places."""
        placed = self._suspended.pop(worker_id, None)
        if placed is None:
            return
        logger.info(
            "worker %s answers again; its replicas are back in routing",
            worker_id,
            extra={"worker_id": worker_id},
        )
        for model, endpoint in placed.items():
            self._add(model, worker_id, endpoint)

    def suspended(self) -> dict[str, str]:
        """Suspended worker id -> its URL (to probe)."""
        return {
            worker: next(iter(placed.values()))[0] for worker, placed in self._suspended.items()
        }

    def close(self) -> None:
        """Cancel pending returns from quarantine."""
        for _, handle in self._quarantined.values():
            handle.cancel()
        self._quarantined.clear()

    async def _apply(self, event: PlacementEvent) -> None:
        if event.kind is PlacementEventKind.RESYNC:
            self._reconcile(await self._source.list_placements())
            if not self._synced.is_set():
                logger.info("placements synced: %d models", len(self._table.models()))
                self._synced.set()
        elif event.placement is None:
            logger.warning("placement event %s without a placement; ignored", event.kind)
        elif event.kind is PlacementEventKind.ADDED:
            placement = event.placement
            self._add(placement.model, placement.worker_id, (placement.url, placement.grpc_address))
        else:
            self._remove(event.placement.model, event.placement.worker_id)

    def _reconcile(self, placements: list[Placement]) -> None:
        wanted = {(p.model, p.worker_id): (p.url, p.grpc_address) for p in placements}
        for model in self._table.models():
            for replica in list(self._table.replicas(model)):
                if (model, replica.worker_id) not in wanted:
                    self._remove(model, replica.worker_id)
        for key in [k for k in self._quarantined if k not in wanted]:
            self._unquarantine(key)
        for worker_id, placed in list(self._suspended.items()):
            for model in [m for m in placed if (m, worker_id) not in wanted]:
                self._unsuspend(model, worker_id)
        for (model, worker_id), endpoint in wanted.items():
            if (model, worker_id) not in self._quarantined:
                self._add(model, worker_id, endpoint)

    def _add(self, model: str, worker_id: str, endpoint: _Endpoint) -> None:
        url, grpc_address = endpoint[0].rstrip("/"), endpoint[1]
        # The store announcing a quarantined replica again means the worker is back.
        self._unquarantine((model, worker_id))
        placed = self._suspended.get(worker_id)
        if placed is not None:
            # Not for a suspended worker: the store cannot tell that it stopped answering.
            placed[model] = (url, grpc_address)
            return
        existing = self._table.get(model, worker_id)
        if existing is not None:
            if existing.url == url and existing.grpc_address == grpc_address:
                return
            self._remove(model, worker_id)
        replica = Replica(worker_id=worker_id, url=url, grpc_address=grpc_address)
        self._table.add(model, replica)
        logger.info(
            "replica of %s ready on worker %s at %s",
            model,
            worker_id,
            url,
            extra={"model": model, "worker_id": worker_id},
        )
        self._listener.replica_added(model, replica)

    def _remove(self, model: str, worker_id: str) -> None:
        self._unquarantine((model, worker_id))
        self._unsuspend(model, worker_id)
        replica = self._table.get(model, worker_id)
        if replica is None:
            return
        self._table.remove(model, replica)
        logger.info(
            "replica of %s on worker %s removed",
            model,
            worker_id,
            extra={"model": model, "worker_id": worker_id},
        )
        self._listener.replica_removed(model, replica)

    def _unsuspend(self, model: str, worker_id: str) -> None:
        """Forget a suspended worker's placement of ``model``; with none left, the worker
        (no longer this activator's business)."""
        placed = self._suspended.get(worker_id)
        if placed is not None and placed.pop(model, None) is not None and not placed:
            del self._suspended[worker_id]

    def _unquarantine(self, key: tuple[str, str]) -> None:
        entry = self._quarantined.pop(key, None)
        if entry is not None:
            entry[1].cancel()

    def _restore(self, key: tuple[str, str]) -> None:
        # Present: every path that drops the entry cancels this timer.
        endpoint, _ = self._quarantined.pop(key)
        self._add(key[0], key[1], endpoint)


class ModelCatalog:
    """Which model names are registered, cached for ``ttl_s`` (known and unknown alike),
    and which of them failed for good (their record's ``failure``).

    Parameters:
        source: the registry, asked on a miss.
        ttl_s: how long an answer is trusted.
        max_entries: bound on cached names; the cache starts over when it is reached.
        retry_after_s: ``Retry-After`` for the 503 when the store fails and nothing is cached.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        source: ModelSource,
        *,
        ttl_s: float,
        max_entries: int,
        retry_after_s: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._entries: dict[str, tuple[bool, float]] = {}
        self._failures: dict[str, ModelFailure] = {}
        """Registered names whose record carries a failure, as last read."""

    def cached(self, name: str) -> bool | None:
        """The cached answer for ``name`` while fresh, else None (no await on the hot path)."""
        entry = self._entries.get(name)
        if entry is not None and entry[1] > self._clock():
            return entry[0]
        return None

    def failure(self, name: str) -> ModelFailure | None:
        """The failure the model's record carried when last read (no await): requests
        for it are answered at once instead of waiting for an activation."""
        return self._failures.get(name)

    def note_failure(self, name: str, failure: ModelFailure) -> None:
        """Remember that ``name``'s load failed for good, learnt from its activation, until
        the next read of its record says otherwise."""
        if name in self._entries:
            self._failures[name] = failure

    async def is_registered(self, name: str) -> bool:
        """Whether ``name`` is registered: the cache while fresh, else the store.

        When the store fails, a stale answer is better than none; with no answer at all
        this raises :class:`CatalogUnavailableError` (a 503).
        """
        cached = self.cached(name)
        if cached is not None:
            return cached
        try:
            record = await self._source.get_model(name)
        except Exception as exc:
            stale = self._entries.get(name)
            if stale is None:
                raise CatalogUnavailableError(
                    model=name, reason=type(exc).__name__, retry_after_s=self._retry_after_s
                ) from exc
            logger.warning("state store failed looking up %s; using the cached answer", name)
            return stale[0]
        self._remember(name, record is not None, record.failure if record else None)
        return record is not None

    async def list_models(self) -> list[ModelRecord]:
        """Every registered model, straight from the store (refreshing the cache)."""
        records = await self._source.list_models()
        for record in records:
            self._remember(record.name, True, record.failure)
        return records

    def _remember(self, name: str, is_registered: bool, failure: ModelFailure | None) -> None:
        if len(self._entries) >= self._max_entries and name not in self._entries:
            self._entries.clear()
            self._failures.clear()
        self._entries[name] = (is_registered, self._clock() + self._ttl_s)
        if failure is None:
            self._failures.pop(name, None)
        else:
            self._failures[name] = failure
