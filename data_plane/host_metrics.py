"""Triton's host gauges: ``nv_cpu_utilization``, ``nv_cpu_memory_*`` and the pinned
memory pool's ``nv_pinned_memory_pool_*``, named, described and typed as Triton 2.51's.

CPU utilization is the machine's (all cores, as Triton reads it from ``/proc/stat``)
between two scrapes: busy jiffies over all jiffies since the previous reading, the first
reading measured from when this object was built. Memory is ``/proc/meminfo``'s
``MemTotal`` and ``MemTotal - MemAvailable``, as Triton computes it. zeroserve keeps no
pinned (page-locked) host pool of its own, so both pinned gauges say 0 bytes: present for
the dashboards that plot them, truthful about the size. Where ``/proc`` cannot be read
(not Linux) the CPU families are left out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

_PROC: Final = Path("/proc")

_PINNED: Final = (
    ("nv_pinned_memory_pool_total_bytes", "Pinned memory pool total memory size, in bytes"),
    ("nv_pinned_memory_pool_used_bytes", "Pinned memory pool used memory size, in bytes"),
)


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """Jiffies since boot, all cores together: busy and in total."""

    busy: int
    total: int


def parse_cpu_times(stat: str) -> CpuTimes:
    """The aggregate ``cpu`` line of ``/proc/stat``; idle and iowait are not busy (as
    Triton counts them). ValueError when the text has no such line."""
    for line in stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:]]
            # user nice system idle iowait irq softirq steal (guest time is inside user).
            counted = values[:8]
            idle = counted[3] + (counted[4] if len(counted) > 4 else 0)
            total = sum(counted)
            return CpuTimes(busy=total - idle, total=total)
    raise ValueError("no aggregate cpu line in /proc/stat")


def parse_memory(meminfo: str) -> tuple[int, int]:
    """(total, used) bytes from ``/proc/meminfo``; used is total less available."""
    found: dict[str, int] = {}
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if name in ("MemTotal", "MemAvailable") and parts:
            found[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    total = found["MemTotal"]
    return total, total - found.get("MemAvailable", total)


def utilization(before: CpuTimes, after: CpuTimes) -> float:
    """The busy share of the jiffies between two readings, 0.0 when none passed."""
    elapsed = after.total - before.total
    if elapsed <= 0:
        return 0.0
    return min(1.0, max(0.0, (after.busy - before.busy) / elapsed))


class HostMetrics:
    """Renders the host gauges at each scrape.

    Parameters:
        read: reads a file under ``/proc`` by its relative name (``stat``, ``meminfo``);
            tests give another.
    """

    def __init__(self, read: Callable[[str], str] | None = None) -> None:
        self._read = read or _read_proc
        self._last: CpuTimes | None = None
        self._warned = False
        try:
            self._last = parse_cpu_times(self._read("stat"))
        except (OSError, ValueError, IndexError):
            self._last = None

    def lines(self) -> Iterator[str]:
        """The gauges in Triton's text, each with its HELP and TYPE."""
        for name, help_text in _PINNED:
            yield from _gauge(name, help_text, "0")
        try:
            now = parse_cpu_times(self._read("stat"))
            total, used = parse_memory(self._read("meminfo"))
        except (OSError, ValueError, IndexError, KeyError) as exc:
            if not self._warned:
                self._warned = True
                logger.warning("no CPU metrics: cannot read /proc (%s)", exc)
            return
        before, self._last = self._last or now, now
        share = utilization(before, now)
        yield from _gauge("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", f"{share:g}")
        yield from _gauge("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", total)
        yield from _gauge("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", used)


def _gauge(name: str, help_text: str, value: object) -> Iterator[str]:
    yield f"# HELP {name} {help_text}"
    yield f"# TYPE {name} gauge"
    yield f"{name} {value}"


def _read_proc(name: str) -> str:
    return (_PROC / name).read_text()
