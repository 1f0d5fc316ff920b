"""The activator's gRPC channels to workers: one per worker, reused by every call to it.

A ``grpc.aio`` channel multiplexes every call to one worker over one HTTP/2 connection, so
the hop costs no connection set-up after the first call. Channels open on first use and
close once their worker has left routing (no replica in the table has its address) and
the last call on it has ended: calls already sent to a worker that the store removed, or
that the replica watch suspended, finish on the channel they started on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

import grpc

from activator.lb import Replica

__all__ = ["WorkerChannels"]

logger = logging.getLogger(__name__)


class RoutedReplicas(Protocol):
    """The replicas in routing (``ReplicaTable``), to tell whether a worker still has one."""

    def models(self) -> list[str]: ...

    def replicas(self, model: str) -> Sequence[Replica]: ...


class _Entry:
    __slots__ = ("calls", "channel", "is_routed")

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.calls = 0
        self.is_routed = True


class WorkerChannels:
    """Channels by worker gRPC address (``host:port``); a ``ReplicaListener``.

    Parameters:
        table: the replicas in routing; a worker none of them names is gone.
        options: gRPC channel arguments for every channel (message sizes, reconnection).
    """

    def __init__(self, table: RoutedReplicas, options: Sequence[tuple[str, int]]) -> None:
        self._table = table
        self._options = list(options)
        self._entries: dict[str, _Entry] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._is_closed = False

    def __len__(self) -> int:
        """Open channels."""
        return len(self._entries)

    def acquire(self, address: str) -> grpc.aio.Channel:
        """The channel to ``address``, opened if needed, counted busy until
        :meth:`release`."""
        if self._is_closed:
            raise RuntimeError("the worker channels are closed")
        entry = self._entries.get(address)
        if entry is None:
            channel = grpc.aio.insecure_channel(address, options=self._options)
            entry = self._entries[address] = _Entry(channel)
            logger.debug("gRPC channel to %s opened", address)
        entry.calls += 1
        return entry.channel

    def release(self, address: str) -> None:
        """A call on ``address``'s channel ended; close it if its worker left routing."""
        entry = self._entries.get(address)
        if entry is None:
            return
        entry.calls -= 1
        if entry.calls == 0 and not entry.is_routed:
            self._close(address, entry)

    def replica_added(self, model: str, replica: Replica) -> None:
        entry = self._entries.get(replica.grpc_address)
        if entry is not None:
            entry.is_routed = True

    def replica_removed(self, model: str, replica: Replica) -> None:
        address = replica.grpc_address
        entry = self._entries.get(address)
        if entry is None or self._is_routed(address):
            return
        entry.is_routed = False
        if entry.calls == 0:
            self._close(address, entry)

    async def close(self) -> None:
        """Close every channel (calls still on them are cancelled)."""
        self._is_closed = True
        for address, entry in list(self._entries.items()):
            self._close(address, entry)
        await asyncio.gather(*self._closing, return_exceptions=True)

    def _is_routed(self, address: str) -> bool:
        return any(
            replica.grpc_address == address
            for model in self._table.models()
            for replica in self._table.replicas(model)
        )

    def _close(self, address: str, entry: _Entry) -> None:
        del self._entries[address]
        logger.debug("gRPC channel to %s closed", address)
        task = asyncio.create_task(entry.channel.close(), name=f"grpc-channel-close-{address}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
