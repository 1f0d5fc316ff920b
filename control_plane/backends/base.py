"""The ``PodBackend`` interface: where runtime workers come from and go to."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Protocol

from foundation.records import WorkerRecord

__all__ = ["PodBackend", "PoolSpec", "WorkerLost"]


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A family of interchangeable workers (one Knative Service, or local processes)."""

    name: str
    device: str = "cpu"
    """``cpu`` or ``cuda``: what the pool's workers run models on."""
    memory_bytes: int = 0
    """Memory budget for models on one worker; 0 = unbounded."""
    max_workers: int = 1
    """Most workers the pool may have at once."""


class WorkerLost(Protocol):
    """Told when a worker went away without being asked to (crash, kill, failed probes)."""

    async def __call__(self, worker_id: str) -> None: ...


class PodBackend(abc.ABC):
    """Starts, lists, probes and stops workers of named pools.

    Implementations: ``local`` (child processes) and ``knative`` (pods of Knative Services).
    Methods are called from one event loop, possibly from several tasks at once. A worker the
    backend lost on its own is reported through the ``WorkerLost`` callback given at
    construction, after it has been removed from ``list_workers``; a worker stopped through
    ``stop_worker`` is not.
    """

    @abc.abstractmethod
    async def ensure_pool(self, pool: PoolSpec) -> None:
        """Create or update ``pool`` so that ``start_worker`` can use it. Idempotent."""

    @abc.abstractmethod
    async def start_worker(self, pool: str) -> WorkerRecord:
        """Start one worker of ``pool`` and return it once it answers its liveness probe.

        Raises ``WorkerStartError`` when it does not come up within the start timeout, or
        ``NoCapacityError`` when the pool is at its ``max_workers``; nothing is left running
        in either case.
        """

    @abc.abstractmethod
    async def stop_worker(self, worker_id: str) -> None:
        """Stop the worker: ask it to drain and exit, and kill it after the stop timeout.

        Returns once it is gone. Unknown ids are ignored.
        """

    @abc.abstractmethod
    async def delete_pool(self, pool: str) -> None:
        """Stop every worker of ``pool`` and forget the pool."""

    @abc.abstractmethod
    def list_workers(self, pool: str | None = None) -> list[WorkerRecord]:
        """The workers that are up (ready or starting), from the backend's own view."""

    @abc.abstractmethod
    async def health(self, worker_id: str) -> bool:
        """One liveness probe of the worker now; False for unknown or dead workers."""

    def details(self, worker_id: str) -> dict[str, object]:
        """Backend-specific facts about a worker for the admin API (a pid, a pod name)."""
        return {}

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop this backend's background tasks and release its workers: ``local`` stops its
        child processes (none remains after this); ``knative`` leaves its pods running, for
        the next acting control plane to adopt with their models."""
