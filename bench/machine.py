"""What the numbers were measured on: hardware, OS, interpreter, libraries, repository commit."""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any


def describe(repo: Path, *, load_generator: str) -> dict[str, Any]:
    """A JSON-ready description of this machine and the software under test."""
    cpuinfo = _read("/proc/cpuinfo")
    models = sorted(set(re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)))
    flags = re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    simd = sorted(
        f for f in (flags.group(1).split() if flags else []) if f.startswith(("avx", "amx", "fma"))
    )
    meminfo = _read("/proc/meminfo")
    mem_kb = re.search(r"^MemTotal:\s*(\d+) kB", meminfo, re.MULTILINE)
    os_release = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', _read("/etc/os-release"), re.MULTILINE))
    return {
        "hostname": socket.gethostname(),
        "cpu_model": models[0] if len(models) == 1 else models,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_simd_flags": simd,
        "cgroup_cpu_max": _read("/sys/fs/cgroup/cpu.max").strip() or None,
        "memory_gib": round(int(mem_kb.group(1)) / 2**20, 1) if mem_kb else None,
        "os": os_release.get("PRETTY_NAME", platform.system()),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "packages": {
            name: _version(name)
            for name in (
                "onnxruntime",
                "numpy",
                "onnx",
                "uvicorn",
                "starlette",
                "uvloop",
                "httptools",
                "orjson",
            )
        },
        "load_average": load_average(),
        "load_generator": load_generator,
        "git": _git(repo),
    }


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy (not idle or waiting on I/O) since boot."""
    first = _read("/proc/stat").split("\n", 1)[0].split()
    if not first or first[0] != "cpu":
        return 0.0
    # user nice system idle iowait irq softirq steal: everything but idle and iowait.
    values = [int(v) for v in first[1:9]]
    busy = sum(values) - values[3] - values[4]
    return busy / os.sysconf("SC_CLK_TCK")


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [float(v) for v in _read("/proc/loadavg").split()[:3]]


def _git(repo: Path) -> dict[str, Any]:
    def run(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], cwd=repo, capture_output=True, text=True, timeout=20
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    status = run("status", "--porcelain")
    return {
        "commit": run("rev-parse", "HEAD") or None,
        "branch": run("rev-parse", "--abbrev-ref", "HEAD") or None,
        "dirty": bool(status),
        "modified_files": status.splitlines()[:50],
    }


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
