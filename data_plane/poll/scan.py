"""A scan of a local model repository: one snapshot per model folder.

A snapshot is a digest of every file under the folder (relative name, size, modification
time in ns), the same quick check the node cache uses to tell that a local model changed,
so a model whose files are untouched scans the same and a rewritten file scans different.
Blocking: run it in a thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from foundation import model_config
from runtimes.cache.layout import local_files

logger = logging.getLogger(__name__)

MAX_FILES_PER_MODEL = 100_000
"""Files read into one snapshot; a folder holding more scans as changed whenever its first
ones do (a bound on a walk that could otherwise follow a huge or looping tree)."""


def scan_models(root: Path) -> dict[str, str | None]:
    """Every model folder under ``root`` (hidden folders and names that are not model names
    left out) and its snapshot, None for a folder that cannot be read right now.

    Raises OSError when ``root`` itself cannot be listed.
    """
    snapshots: dict[str, str | None] = {}
    for path in sorted(root.iterdir()):
        if path.name.startswith(".") or not path.is_dir():
            continue
        try:
            model_config.validate_model_name(path.name)
        except model_config.ConfigError:
            continue
        snapshots[path.name] = _snapshot(path)
    return snapshots


def _snapshot(folder: Path) -> str | None:
    files: list[tuple[str, int, int]] = []
    try:
        for relative, path in local_files(folder):
            stat = path.stat()
            files.append((relative, stat.st_size, stat.st_mtime_ns))
            if len(files) >= MAX_FILES_PER_MODEL:
                break
    except OSError as exc:
        logger.warning("cannot scan model folder %s: %s", folder, exc)
        return None
    return hashlib.sha256(json.dumps(sorted(files)).encode()).hexdigest()
