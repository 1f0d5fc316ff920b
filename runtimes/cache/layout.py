"""The node cache's folders, manifests and crash-safe writes.

    <root>/
      models/<entry>/<version>/     one fetched model version, immutable once it has this name
          .pin                      its pin file (see ``pins``)
          manifest.json             source, objects, ETags and checks made
          model/                    the Triton-layout folder that ``CachedModel.path`` names
      engines/<runtime>/<key>/      warm engine caches written by runtimes, each with a .pin
      links/<entry>/model/1/...     a single local model file, laid out through a symlink
      locks/<entry>.lock            one fetch of an entry at a time, node-wide
      locks/evict.lock              one eviction pass at a time, node-wide
      tmp/<name>/                   fetches in progress (pinned by their fetcher) and
                                    folders being deleted

``<entry>`` is a hash of the endpoint and URI; ``<version>`` a hash of the objects' keys,
sizes and ETags, so a changed object yields a new version and an unchanged model the same.
A fetch writes into ``tmp/``, fsyncs every file and folder, then renames the folder into
``models/``: a version folder either is complete or does not exist. Whatever a killed
process left in ``tmp/`` is unpinned (the kernel dropped its lock) and is swept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from runtimes.cache.pins import PIN_FILENAME, try_exclusive

MANIFEST: Final = "manifest.json"
MODEL_FOLDER: Final = "model"
_EXPECTED_BYTES: Final = ".expected_bytes"
_ORPHAN_AGE_S: Final = 60.0
"""A tmp folder without a pin file older than this was left by a process killed at birth."""


@dataclass(frozen=True)
class CacheItem:
    """An evictable folder, or a fetch in progress, as the evictor sees it."""

    path: Path
    last_used: float
    is_in_progress: bool


class CacheLayout:
    """Paths inside one cache root, and the blocking file operations on them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.models = root / "models"
        self.engines = root / "engines"
        self.links = root / "links"
        self.locks = root / "locks"
        self.tmp = root / "tmp"

    def ensure(self) -> None:
        for folder in (self.models, self.engines, self.links, self.locks, self.tmp):
            folder.mkdir(parents=True, exist_ok=True)

    def entry_name(self, *parts: str) -> str:
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]

    def lock_path(self, entry: str) -> Path:
        return self.locks / f"{entry}.lock"

    @property
    def evict_lock(self) -> Path:
        return self.locks / "evict.lock"

    def new_tmp_dir(self, label: str, expected_bytes: int) -> Path:
        """A fresh folder in ``tmp/`` that counts ``expected_bytes`` towards the cache size."""
        path = self.tmp / f"{label}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        path.mkdir()
        (path / _EXPECTED_BYTES).write_text(str(expected_bytes))
        return path

    def sweep_tmp(self) -> None:
        """Delete what dead processes left in ``tmp/`` (their pins are gone with them)."""
        for path in _children(self.tmp):
            fd = try_exclusive(path / PIN_FILENAME)
            if fd is None:
                pinless = not (path / PIN_FILENAME).exists()
                with contextlib.suppress(FileNotFoundError):
                    if pinless and time.time() - path.stat().st_mtime > _ORPHAN_AGE_S:
                        shutil.rmtree(path, ignore_errors=True)
                continue
            try:
                shutil.rmtree(path, ignore_errors=True)
            finally:
                os.close(fd)

    def items(self) -> list[CacheItem]:
        """Every model version, engine cache and fetch in progress."""
        items: list[CacheItem] = []
        for parent, in_progress in (
            *((entry, False) for entry in _children(self.models)),
            *((runtime, False) for runtime in _children(self.engines)),
            (self.tmp, True),
        ):
            for path in _children(parent):
                try:
                    last_used = (path / PIN_FILENAME).stat().st_mtime
                except FileNotFoundError:
                    if not in_progress:
                        continue  # not ours to evict (no pin protocol)
                    last_used = time.time()
                items.append(CacheItem(path, last_used, in_progress))
        return items

    def size_bytes(self) -> int:
        """Bytes under the cache: files counted once per inode (hard links share bytes), and
        fetches in progress counted at their expected size."""
        seen: set[tuple[int, int]] = set()
        total = 0
        for top in (self.models, self.engines):
            total += _tree_bytes(top, seen)
        for path in _children(self.tmp):
            actual = _tree_bytes(path, seen)
            try:
                expected = int((path / _EXPECTED_BYTES).read_text() or 0)
            except (FileNotFoundError, ValueError):
                expected = 0
            total += max(actual, expected)
        return total

    def remove(self, folder: Path) -> None:
        """Take ``folder`` out of view at once (rename into ``tmp/``), then delete it."""
        trash = self.tmp / f"trash-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` durably (the folder is renamed into place only afterwards)."""
    path = folder / MANIFEST
    with path.open("w", encoding="utf-8") as file:
        json.dump(manifest, file, indent=1, sort_keys=True)
        file.flush()
        os.fsync(file.fileno())


def read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        with (folder / MANIFEST).open(encoding="utf-8") as file:
            manifest: dict[str, Any] = json.load(file)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    return manifest


def fsync_tree(folder: Path) -> None:
    """fsync every folder under ``folder`` (files are fsynced when written)."""
    for dirpath, _dirnames, _filenames in os.walk(folder):
        fsync_dir(Path(dirpath))


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def local_files(folder: Path) -> Iterator[tuple[str, Path]]:
    """``(relative path, path)`` of every file under ``folder``, hidden folders skipped.

    Symlinked folders are followed, since a runtime reads through them: a digest or a size
    must count what they hold. Links keep their names in the tree; nothing is resolved.
    """
    for relative, path, is_folder in _walk(folder, skip_hidden=True):
        if not is_folder:
            yield relative, path


def local_entries(folder: Path) -> Iterator[tuple[str, Path]]:
    """``(relative path, path)`` of every file and folder under ``folder``, hidden ones and
    symlinked folders included, links unresolved: what a caller resolves to check that
    nothing leads out of an allowed root (an empty linked folder too, as it may be filled
    later)."""
    for relative, path, _is_folder in _walk(folder, skip_hidden=False):
        yield relative, path


def _walk(folder: Path, *, skip_hidden: bool) -> Iterator[tuple[str, Path, bool]]:
    # Each real folder is entered once, so a link back up the tree ends the walk instead
    # of looping until the path grows too long.
    entered = {os.path.realpath(folder)}
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        kept = []
        for name in sorted(dirnames):
            if skip_hidden and name.startswith("."):
                continue
            path = Path(dirpath) / name
            yield path.relative_to(folder).as_posix(), path, True
            real = os.path.realpath(path)
            if real not in entered:
                entered.add(real)
                kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            path = Path(dirpath) / name
            yield path.relative_to(folder).as_posix(), path, False


def _children(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
    except FileNotFoundError:
        return []


def _tree_bytes(folder: Path, seen: set[tuple[int, int]]) -> int:
    total = 0
    for dirpath, _dirnames, filenames in os.walk(folder):
        for name in filenames:
            try:
                stat = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue  # deleted while we looked
            key = (stat.st_dev, stat.st_ino)
            if key not in seen:
                seen.add(key)
                total += stat.st_size
    return total
