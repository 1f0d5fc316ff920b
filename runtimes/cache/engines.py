"""Warm engine caches: what a runtime built from a model, kept in the node cache for reuse.

Engines (ONNX Runtime's optimized model, TensorRT engines, compile caches) live in
``<root>/engines/<runtime>/<key>/``, where the key hashes the model's identity, the
hardware and the library version: a different GPU, driver or ORT release builds anew
rather than loading something built for another. Each folder has a ``.pin`` (see ``pins``):
a runtime holds it while its model is loaded, so the cache's LRU eviction counts these
folders and evicts them like model versions, but never one in use.

A build writes into a pinned folder in ``tmp/`` and is published by one rename, so a
reader sees a complete engine or none; when two processes build the same engine at once,
the first rename wins and the other's copy is discarded.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from runtimes.cache.layout import CacheLayout, fsync_dir, fsync_tree, local_files
from runtimes.cache.pins import PIN_FILENAME, Pin, exclusive_lock, try_exclusive

COMPLETE: Final = "complete.json"
"""Written last in an engine folder; its presence means the folder is usable."""


class EngineCache:
    """Engine folders for one runtime kind under a node cache root.

    Blocking (file I/O and lock waits): call from the runtime's executor, not the event loop.
    """

    def __init__(self, root: Path, runtime: str, *, lock_timeout_s: float = 600.0) -> None:
        self._layout = CacheLayout(root)
        self._folder = self._layout.engines / runtime
        self._lock_timeout_s = lock_timeout_s

    def key(self, parts: Mapping[str, Any]) -> str:
        """A folder name for these key parts (any JSON-able mapping)."""
        text = json.dumps(parts, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:40]

    def open(self, key: str) -> Pin | None:
        """The complete engine folder ``key``, pinned (``pin.path.parent``), or None."""
        folder = self._folder / key
        try:
            pin = Pin.acquire(folder, timeout_s=self._lock_timeout_s)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not pin.is_current() or not (folder / COMPLETE).is_file():
            pin.release()
            return None
        pin.touch()
        return pin

    @contextlib.contextmanager
    def build(self, key: str) -> Iterator[EngineBuild]:
        """A pinned scratch folder for a new engine; :meth:`EngineBuild.publish` keeps it.

        Whatever is not published is deleted on exit, also on error.
        """
        self._layout.ensure()
        self._layout.sweep_tmp()
        tmp = self._layout.new_tmp_dir(f"engine-{key[:16]}", 0)
        pin = Pin.acquire(tmp, timeout_s=self._lock_timeout_s, create=True)
        build = EngineBuild(tmp, self._folder / key, pin)
        try:
            yield build
        finally:
            if not build.is_published:
                pin.release()
                shutil.rmtree(tmp, ignore_errors=True)

    def shared(self, key: str) -> tuple[Pin, bool]:
        """The engine folder ``key`` for an engine that writes its own files in place
        (TensorRT's engine cache), created if missing and pinned; and whether it held
        anything already. Hold :meth:`lock` while the engine may write."""
        folder = self._folder / key
        folder.mkdir(parents=True, exist_ok=True)
        pin = Pin.acquire(folder, timeout_s=self._lock_timeout_s, create=True)
        had_files = any(p.name not in {PIN_FILENAME, COMPLETE} for p in folder.iterdir())
        (folder / COMPLETE).touch()
        pin.touch()
        return pin, had_files

    def lock(self, key: str) -> contextlib.AbstractContextManager[None]:
        """A node-wide exclusive lock for building engine ``key``."""
        self._layout.ensure()
        return exclusive_lock(
            self._layout.locks / f"engine-{key}.lock", timeout_s=self._lock_timeout_s
        )

    def discard(self, key: str) -> None:
        """Remove engine ``key`` (found unusable) unless someone has it pinned."""
        folder = self._folder / key
        fd = try_exclusive(folder / PIN_FILENAME)
        if fd is None:
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                self._layout.remove(folder)
        finally:
            os.close(fd)


class EngineBuild:
    """A scratch folder where a runtime writes a new engine before publishing it."""

    def __init__(self, path: Path, target: Path, pin: Pin) -> None:
        self.path = path
        self._target = target
        self._pin = pin
        self.is_published = False

    def publish(self, description: Mapping[str, Any]) -> Pin:
        """fsync the engine, mark it complete and rename it into place; the engine folder
        comes back pinned. If another process published the same key first, its folder is
        kept, ours is dropped, and the pin is on theirs."""
        (self.path / COMPLETE).write_text(
            json.dumps({"created": time.time(), **description}, default=str, indent=1)
        )
        for _relative, file in local_files(self.path):
            fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_tree(self.path)
        self._target.parent.mkdir(parents=True, exist_ok=True)
        for _attempt in range(3):
            try:
                os.rename(self.path, self._target)
                break
            except OSError:  # ENOTEMPTY/EEXIST: lost the race; theirs is equivalent
                pass
            try:
                theirs = Pin.acquire(self._target, timeout_s=60.0)
            except FileNotFoundError:
                continue  # evicted between our rename and our pin: publish ours after all
            self._pin.release()
            shutil.rmtree(self.path, ignore_errors=True)
            self.is_published = True
            return theirs
        else:
            raise OSError(f"cannot publish the engine at {self._target}")
        fsync_dir(self._target.parent)
        self._pin.path = self._target / PIN_FILENAME
        self.is_published = True
        return self._pin


def model_identity(model_dir: Path) -> list[tuple[str, int, int]]:
    """``(relative path, size, mtime_ns)`` of every file of a model version folder.

    Node-cache folders are immutable and content-addressed, so this stands for their
    content; for a user's folder a changed file changes its size or mtime.
    """
    identity = []
    for relative, path in local_files(model_dir):
        stat = path.stat()
        identity.append((relative, stat.st_size, stat.st_mtime_ns))
    return identity


def hardware_identity(device: str) -> dict[str, str]:
    """What an engine built for ``device`` depends on: CPU model and ISA flags, and for
    ``cuda:N`` the GPU model and the driver version (read from /proc, no CUDA needed)."""
    cpuinfo = _read("/proc/cpuinfo")
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    flags = re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    identity = {
        "machine": platform.machine(),
        "cpu": model.group(1).strip() if model else "",
        "cpu_flags": hashlib.sha256((flags.group(1) if flags else "").encode()).hexdigest()[:16],
        "device": device.split(":", 1)[0],
    }
    if device.startswith("cuda"):
        driver = re.search(r"Kernel Module\s+(\S+)", _read("/proc/driver/nvidia/version"))
        gpus = sorted(
            found.group(1).strip()
            for info in glob.glob("/proc/driver/nvidia/gpus/*/information")
            if (found := re.search(r"^Model:\s*(.+)$", _read(info), re.MULTILINE))
        )
        identity |= {"driver": driver.group(1) if driver else "", "gpus": ",".join(gpus)}
    return identity


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError:
        return ""
