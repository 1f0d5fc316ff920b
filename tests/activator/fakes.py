"""Fakes for the activator's dependencies.

:class:`FakeStore` is the slice of ``StateStore`` the activator uses (placements with
subscriptions, models, traffic and first responses), with what the tests need on top:
failures on demand, the reports as sent, and a way to wait for one. The real
``MemoryStateStore`` runs in ``test_proxy_integration.test_with_the_memory_state_store``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable

from activator.lb import Replica
from foundation.keys import ALL_KEYS, ApiKeyRecord
from foundation.records import (
    FirstResponse,
    ModelRecord,
    Placement,
    PlacementEvent,
    PlacementEventKind,
    TrafficReport,
)


class FakeStore:
    """Models, placements (published to subscribers) and traffic reports, in memory."""

    def __init__(self) -> None:
        self.models: dict[str, ModelRecord] = {}
        self.placements: dict[tuple[str, str], Placement] = {}
        self.reports: list[TrafficReport] = []
        self.first_responses: list[FirstResponse] = []
        self.get_model_calls: list[str] = []
        self.get_model_error: Exception | None = None
        self.report_error: Exception | None = None
        self._subscribers: list[asyncio.Queue[PlacementEvent | Exception]] = []
        self._reported = asyncio.Condition()
        self.keys: dict[str, ApiKeyRecord] = {}
        self.get_key_calls: list[str] = []
        self._revocation_queues: list[asyncio.Queue[str]] = []

    async def get_key(self, key_id: str) -> ApiKeyRecord | None:
        self.get_key_calls.append(key_id)
        return self.keys.get(key_id)

    async def subscribe_key_revocations(self) -> AsyncIterator[str]:
        queue: asyncio.Queue[str] = asyncio.Queue()
        self._revocation_queues.append(queue)
        try:
            yield ALL_KEYS
            while True:
                yield await queue.get()
        finally:
            self._revocation_queues.remove(queue)

    def revoke(self, key_id: str, revoked_at: float) -> None:
        """Mark the key revoked and tell the subscribers."""
        self.keys[key_id] = dataclasses.replace(self.keys[key_id], revoked_at=revoked_at)
        for queue in self._revocation_queues:
            queue.put_nowait(key_id)

    def register(self, name: str) -> None:
        self.models[name] = ModelRecord(name=name, storage_uri=f"file:///models/{name}")

    async def get_model(self, name: str) -> ModelRecord | None:
        self.get_model_calls.append(name)
        if self.get_model_error is not None:
            raise self.get_model_error
        return self.models.get(name)

    async def list_models(self) -> list[ModelRecord]:
        return list(self.models.values())

    async def list_placements(self, model: str | None = None) -> list[Placement]:
        return [p for p in self.placements.values() if model is None or p.model == model]

    async def subscribe_placements(self) -> AsyncIterator[PlacementEvent]:
        queue: asyncio.Queue[PlacementEvent | Exception] = asyncio.Queue()
        self._subscribers.append(queue)
        try:
            yield PlacementEvent(PlacementEventKind.RESYNC)
            while True:
                event = await queue.get()
                if isinstance(event, Exception):
                    raise event
                yield event
        finally:
            self._subscribers.remove(queue)

    async def add_placement(self, placement: Placement) -> None:
        self.placements[placement.model, placement.worker_id] = placement
        self.publish(PlacementEvent(PlacementEventKind.ADDED, placement))

    async def remove_placement(self, model: str, worker_id: str) -> None:
        placement = self.placements.pop((model, worker_id), None)
        if placement is not None:
            self.publish(PlacementEvent(PlacementEventKind.REMOVED, placement))

    def publish(self, event: PlacementEvent | Exception) -> None:
        """Send ``event`` to every subscriber; an exception makes their iterators raise."""
        for queue in self._subscribers:
            queue.put_nowait(event)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    async def report_traffic(self, report: TrafficReport) -> None:
        if self.report_error is not None:
            raise self.report_error
        self.reports.append(report)
        async with self._reported:
            self._reported.notify_all()

    async def wait_for_report(self, predicate: Callable[[TrafficReport], bool]) -> None:
        """Wait until some report satisfies ``predicate``."""
        async with self._reported:
            await self._reported.wait_for(lambda: any(predicate(r) for r in self.reports))

    async def report_first_response(self, report: FirstResponse) -> None:
        if self.report_error is not None:
            raise self.report_error
        self.first_responses.append(report)
        async with self._reported:
            self._reported.notify_all()

    async def wait_for_first_response(self) -> FirstResponse:
        """Wait until a first response was reported; the first one."""
        async with self._reported:
            await self._reported.wait_for(lambda: bool(self.first_responses))
        return self.first_responses[0]


class RecordingActivate:
    """An ``Activate`` that records its calls; it may wait for ``gate`` and then raise."""

    def __init__(self, *, error: Exception | None = None, gate: asyncio.Event | None = None):
        self.calls: list[str] = []
        self.called = asyncio.Event()
        self.error = error
        self.gate = gate
        self._changed = asyncio.Condition()

    async def __call__(self, model: str) -> None:
        self.calls.append(model)
        self.called.set()
        async with self._changed:
            self._changed.notify_all()
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error

    async def wait_for_calls(self, count: int) -> None:
        """Wait until ``count`` calls were made."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.calls) >= count)


class RecordingListener:
    """A ``ReplicaListener`` that records what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def replica_added(self, model: str, replica: Replica) -> None:
        self.events.append(("added", model, replica.worker_id))

    def replica_removed(self, model: str, replica: Replica) -> None:
        self.events.append(("removed", model, replica.worker_id))


async def settle(turns: int = 20) -> None:
    """Let every ready task run: event-loop turns without I/O or timers in between."""
    for _ in range(turns):
        await asyncio.sleep(0)
