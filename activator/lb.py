"""Choosing among the ready replicas of one model: least outstanding requests, or, for the
requests of a sequence, the replica its correlation ID hashes to.

Pure: no I/O, no clock, no randomness. The caller owns the replicas and their counters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(eq=False, slots=True)
class Replica:
    """One ready copy of a model as this activator sees it.

    Compared and hashed by identity: two placements of one model on one worker are never
    alive at once, and a replica that comes back is a new object with a fresh count.
    """

    worker_id: str
    url: str
    """Base URL of the worker's data plane, without a trailing slash."""
    in_flight: int = 0
    """Requests this activator has sent to the replica and not yet finished streaming."""
    awaiting_head: int = 0
    """Requests sent whose answer's head has not arrived yet."""
    progress_at: float = 0.0
    """Event-loop time of the last head from the replica, or of the request that found none
    pending: how long the replica has kept its callers waiting (:mod:`activator.health`)."""
    grpc_address: str = ""
    """``host:port`` of the worker's gRPC server; empty when it serves no gRPC."""


def choose(replicas: Sequence[Replica], *, offset: int = 0) -> Replica | None:
    """The replica with the fewest requests in flight, or None when there is none.

    Ties go to the first one at or after position ``offset`` (taken modulo the length), so a
    caller that advances ``offset`` on every pick spreads an idle model's requests evenly
    instead of always filling the first replica.
    """
    count = len(replicas)
    if count == 0:
        return None
    start = offset % count
    best = replicas[start]
    for step in range(1, count):
        candidate = replicas[(start + step) % count]
        if candidate.in_flight < best.in_flight:
            best = candidate
    return best


def choose_for_key(replicas: Sequence[Replica], key: int | str) -> Replica | None:
    """The replica ``key`` hashes to (rendezvous hashing over worker ids), or None.

    Every activator computes the same answer from the same replica set, and a replica
    joining or leaving moves only the keys that hash to it, so requests of one sequence
    that reach different activators still meet on one replica.
    """
    best: Replica | None = None
    best_score = -1
    encoded = str(key).encode()
    for replica in replicas:
        digest = hashlib.blake2b(
            replica.worker_id.encode() + b"\0" + encoded, digest_size=8
        ).digest()
        score = int.from_bytes(digest, "big")
        if score > best_score:
            best, best_score = replica, score
    return best
