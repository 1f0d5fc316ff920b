"""Whether a replica may sleep on a worker: sleeping keeps its weights in host memory.

An LLM engine asleep (vLLM's sleep level 1) has moved its weights from the GPU into the
worker's host memory, where they stay until it wakes or unloads. Host memory is the pod's
memory limit, which the kernel enforces by killing the worker with every model on it, so
sleepers are counted against the worker's host budget (``worker_host_memory_bytes``) and a
replica that would not fit is unloaded instead. A replica's ``memory_bytes`` (weights plus
KV cache on the device) stands for its weights: never less than they are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["SleepRoom", "sleep_room"]


@dataclass(frozen=True, slots=True)
class SleepRoom:
    """The decision: sleep (``fits``) or unload, and why."""

    fits: bool
    reason: str


def sleep_room(*, budget: int, asleep: Iterable[int], replica: int) -> SleepRoom:
    """Whether a replica of ``replica`` bytes may sleep on a worker with ``budget`` bytes of
    host memory for sleepers (0: unbounded) where replicas of ``asleep`` bytes sleep (or are
    falling asleep) already; a size of 0 is unknown."""
    if budget <= 0:
        return SleepRoom(True, "the worker's host memory for sleepers is unbounded")
    if replica <= 0:
        return SleepRoom(False, "its memory_bytes is unknown, so its weights cannot be counted")
    held = sum(asleep)
    if held + replica > budget:
        return SleepRoom(
            False,
            f"its {replica} bytes with the {held} bytes asleep there exceed the worker's "
            f"{budget} bytes of host memory for sleepers",
        )
    return SleepRoom(True, f"{held + replica} of {budget} bytes of host memory for sleepers")
