"""HostMetrics: Triton's CPU and pinned-memory gauges from /proc's texts."""

from __future__ import annotations

import pytest

from data_plane.host_metrics import CpuTimes, HostMetrics, parse_cpu_times, parse_memory

STAT = "cpu  {user} 0 {system} {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"
MEMINFO = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\n"


class _Proc:
    """/proc as a test writes it: the stat text changes between scrapes."""

    def __init__(self) -> None:
        self.stat = STAT.format(user=100, system=100, idle=700, iowait=100)

    def read(self, name: str) -> str:
        return self.stat if name == "stat" else MEMINFO


def test_utilization_is_the_busy_share_between_two_scrapes() -> None:
    proc = _Proc()
    metrics = HostMetrics(proc.read)
    # 300 more jiffies: 150 busy (user + system), 150 idle or waiting.
    proc.stat = STAT.format(user=200, system=150, idle=800, iowait=150)
    lines = list(metrics.lines())
    assert "nv_cpu_utilization 0.5" in lines
    assert "nv_cpu_memory_total_bytes 1024000" in lines
    assert "nv_cpu_memory_used_bytes 768000" in lines
    assert "nv_pinned_memory_pool_total_bytes 0" in lines
    # Nothing changed since: no time passed, nothing busy.
    assert "nv_cpu_utilization 0" in list(metrics.lines())


def test_the_aggregate_line_counts_idle_and_iowait_as_not_busy() -> None:
    times = parse_cpu_times(STAT.format(user=5, system=3, idle=10, iowait=2))
    assert times == CpuTimes(busy=8, total=20)
    assert parse_memory(MEMINFO) == (1024000, 768000)
    with pytest.raises(ValueError, match="no aggregate cpu line"):
        parse_cpu_times("intr 1 2 3\n")


def test_without_proc_only_the_pinned_gauges_remain() -> None:
    def unreadable(name: str) -> str:
        raise OSError(f"no /proc/{name}")

    lines = list(HostMetrics(unreadable).lines())
    assert [line for line in lines if not line.startswith("#")] == [
        "nv_pinned_memory_pool_total_bytes 0",
        "nv_pinned_memory_pool_used_bytes 0",
    ]
