"""POSIX shared-memory objects for the tests, made the way clients make them
(``tritonclient.utils.shared_memory`` and ``multiprocessing.shared_memory`` both call
``shm_open``), under unique names, and removed after."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory

from data_plane.shared_memory import SHM_ROOT


def unique_name(prefix: str = "zs-test") -> str:
    """A name no other test (or test run) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def shm_object(size: int) -> Iterator[tuple[str, memoryview]]:
    """A new object of ``size`` bytes: its key (``/name``) and the client's view of it."""
    name = unique_name()
    handle = shared_memory.SharedMemory(name=name, create=True, size=size)
    view = handle.buf
    assert view is not None
    try:
        yield f"/{name}", view
    finally:
        del view
        handle.close()
        with contextlib.suppress(FileNotFoundError):
            handle.unlink()


@contextlib.contextmanager
def shm_entry(kind: str, target: str = "/etc/passwd") -> Iterator[str]:
    """Something other than a plain object directly under /dev/shm, for keys that must be
    refused: ``kind`` is ``link`` (a symlink to ``target``), ``dir`` (a folder holding a
    file ``inner``) or ``fifo``. Yields its key."""
    name = unique_name()
    path = SHM_ROOT / name
    if kind == "link":
        path.symlink_to(target)
    elif kind == "dir":
        path.mkdir()
        (path / "inner").write_bytes(b"x" * 64)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        raise ValueError(kind)
    try:
        yield f"/{name}"
    finally:
        if kind == "dir":
            shutil.rmtree(path)
        else:
            path.unlink()
