"""The state store interface: one contract, with in-memory, SQLite and Redis implementations."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from typing import Any

from control_plane.errors import ConflictError
from foundation.keys import ApiKeyRecord
from foundation.records import (
    FirstResponse,
    ModelRecord,
    Placement,
    PlacementEvent,
    TrafficReport,
    WorkerRecord,
)


class StoreConflictError(ConflictError):
    """A create of something that exists, or an update of something that does not."""


class StateStore(abc.ABC):
    """Models, workers, placements, traffic, activations and the acting-replica lease.

    Every method is safe to call from several tasks (and, for Redis, several processes) at
    once. Methods raise only on store failure (connection lost): callers decide whether to
    retry. ``subscribe_*`` iterators survive reconnects: after one they first yield a RESYNC
    event (placements) so consumers re-read the full state, or everything still pending
    (activation requests) or kept (first responses).
    """

    # ---- models ----
    @abc.abstractmethod
    async def create_model(self, record: ModelRecord) -> None:
        """Register; raises StoreConflictError if the name exists."""

    @abc.abstractmethod
    async def update_model(
        self, record: ModelRecord, *, expected_generation: int | None = None
    ) -> None:
        """Replace; raises StoreConflictError if the name does not exist or, with
        ``expected_generation``, if the stored record has another generation (so that a
        read-modify-write never undoes a concurrent change)."""

    @abc.abstractmethod
    async def get_model(self, name: str) -> ModelRecord | None: ...

    @abc.abstractmethod
    async def list_models(self) -> list[ModelRecord]: ...

    @abc.abstractmethod
    async def delete_model(self, name: str) -> bool:
        """Remove the model with its placements, traffic and activations; False if absent."""

    # ---- workers ----
    @abc.abstractmethod
    async def put_worker(self, worker: WorkerRecord) -> None: ...

    @abc.abstractmethod
    async def remove_worker(self, worker_id: str) -> None:
        """Remove the worker and every placement on it (publishing REMOVED events)."""

    @abc.abstractmethod
    async def list_workers(self) -> list[WorkerRecord]: ...

    # ---- placements (published to subscribers) ----
    @abc.abstractmethod
    async def add_placement(self, placement: Placement) -> None: ...

    @abc.abstractmethod
    async def remove_placement(self, model: str, worker_id: str) -> None: ...

    @abc.abstractmethod
    async def list_placements(self, model: str | None = None) -> list[Placement]: ...

    @abc.abstractmethod
    def subscribe_placements(self) -> AsyncIterator[PlacementEvent]:
        """Placement changes as they happen; starts with a RESYNC event."""

    # ---- sleeping replicas (not published: activators never route to them) ----
    @abc.abstractmethod
    async def put_sleeping(self, replica: Placement) -> None:
        """Record that ``replica.model`` sleeps on ``replica.worker_id`` (``since``: when it
        fell asleep); replaces an earlier record of the pair."""

    @abc.abstractmethod
    async def remove_sleeping(self, model: str, worker_id: str) -> bool:
        """Forget a sleeping replica; True only for the one caller that removed it, so that
        a wake and an unload of the same replica never both go ahead."""

    @abc.abstractmethod
    async def list_sleeping(self, model: str | None = None) -> list[Placement]:
        """Sleeping replicas, of one model or all, sorted by (model, worker id).

        ``delete_model`` and ``remove_worker`` remove theirs too."""

    # ---- activation requests (activators -> acting control plane) ----
    @abc.abstractmethod
    async def request_activation(self, model: str) -> None:
        """Ask the acting control plane to bring ``model`` up (idempotent while pending)."""

    @abc.abstractmethod
    def subscribe_activation_requests(self) -> AsyncIterator[str]:
        """Model names whose activation was requested (at-least-once)."""

    # ---- first responses (activators -> acting control plane) ----
    @abc.abstractmethod
    async def report_first_response(self, report: FirstResponse) -> None:
        """Publish an activator's first response after a cold start; it is kept for as long
        as an activation request stays pending, so a control plane that subscribes within
        that time (after a failover) still gets it."""

    @abc.abstractmethod
    def subscribe_first_responses(self) -> AsyncIterator[FirstResponse]:
        """First responses (at-least-once): every one still kept, then new ones."""

    # ---- traffic (activators -> autoscaler and reaper) ----
    @abc.abstractmethod
    async def report_traffic(self, report: TrafficReport) -> None: ...

    @abc.abstractmethod
    async def traffic(self, model: str) -> list[TrafficReport]:
        """The latest report of each activator for ``model``."""

    # ---- activation timelines ----
    @abc.abstractmethod
    async def add_activation(self, model: str, timeline: dict[str, Any], *, keep: int) -> None:
        """Append a cold-start timeline, keeping the newest ``keep``."""

    @abc.abstractmethod
    async def update_activation(self, model: str, timeline: dict[str, Any]) -> bool:
        """Replace the kept timeline whose ``"id"`` is ``timeline["id"]``, in place; False
        when none is kept (trimmed, or the model deleted). ValueError without a str id."""

    @abc.abstractmethod
    async def list_activations(self, model: str) -> list[dict[str, Any]]:
        """Newest first."""

    # ---- API keys (read by every activator; revocations published) ----
    @abc.abstractmethod
    async def create_key(self, record: ApiKeyRecord) -> None:
        """Store a new key; raises StoreConflictError if its id exists."""

    @abc.abstractmethod
    async def get_key(self, key_id: str) -> ApiKeyRecord | None:
        """The key with this public id, revoked ones included; None if there is none."""

    @abc.abstractmethod
    async def list_keys(self) -> list[ApiKeyRecord]:
        """Every key, revoked ones included, sorted by id."""

    @abc.abstractmethod
    async def revoke_key(self, key_id: str, *, revoked_at: float) -> ApiKeyRecord | None:
        """Mark the key revoked at ``revoked_at`` (a key revoked before keeps its first
        time) and publish its id to revocation subscribers; the record after, or None when
        there is no such key."""

    @abc.abstractmethod
    def subscribe_key_revocations(self) -> AsyncIterator[str]:
        """Ids of keys as they are revoked. Starts with ``foundation.keys.ALL_KEYS`` (and
        yields it again after a reconnect or an overflow): forget every cached key."""

    # ---- per-model control state (what policies learn, kept across failovers) ----
    @abc.abstractmethod
    async def put_model_state(self, model: str, key: str, doc: dict[str, Any]) -> None:
        """Keep ``doc`` (JSON-ready) under ``key`` for ``model``, replacing an earlier one;
        ``delete_model`` removes all of the model's. Last writer wins."""

    @abc.abstractmethod
    async def get_model_state(self, model: str, key: str) -> dict[str, Any] | None:
        """The doc kept under ``key`` for ``model``; None when there is none."""

    # ---- lease: only one control plane acts ----
    @abc.abstractmethod
    async def try_acquire_lease(self, holder: str, ttl_s: float) -> bool:
        """Take or renew the lease for ``holder``; False while another holder's is valid."""

    @abc.abstractmethod
    async def release_lease(self, holder: str) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...
