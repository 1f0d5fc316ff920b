"""A cache folder of PyPI wheels, downloaded once and unpacked under a lock: how the
benchmarks install the binaries they run beside zeroserve (Triton, perf_analyzer).

:func:`cache_dir` names the folder, :func:`install_lock` holds it while one process
downloads and unpacks (test processes side by side share the cache: one installs, the
others wait and then find it complete), and :func:`pip_download` fetches one wheel into it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


def cache_dir(name: str) -> Path:
    """``<XDG cache>/zeroserve/<name>``: where an install lives between runs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "zeroserve" / name


@contextlib.contextmanager
def install_lock(cache: Path) -> Iterator[None]:
    """Creates ``cache`` and holds its install lock for the block; OSError if it cannot."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def pip_download(
    folder: Path, requirement: str, wheel_glob: str, *, only_binary: bool, timeout_s: float
) -> str | None:
    """Downloads ``requirement`` (no dependencies) into ``folder``: None once a wheel
    matching ``wheel_glob`` is there, else why not (pip's own words)."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    if only_binary:
        command.append("--only-binary=:all:")
    done = subprocess.run(
        [*command, "--dest", str(folder), requirement],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0 or not list(folder.glob(wheel_glob)):
        return f"pip download {requirement} failed: {done.stderr[-500:]}"
    return None
