"""File locks shared by every process on the node: fetch locks and pins.

Two protocols, both on ``fcntl.flock`` so that the kernel drops a lock when its process
dies (a killed worker leaves no stale lock and no stale pin):

* **Fetch lock** — an exclusive lock on ``locks/<entry>.lock`` while one process fetches a
  model; the others wait for it, then find the model in the cache.
* **Pin** — every cache folder that may be evicted (a model version, an engine cache, a
  fetch in progress) has a ``.pin`` file. Whoever uses the folder holds a *shared* lock on
  it; the evictor deletes a folder only after taking an *exclusive* lock without waiting.
  The pin file's mtime is the folder's last use, which orders LRU eviction.

flock has no timeout and signals cannot interrupt it off the main thread, so waits poll
with ``LOCK_NB`` (backing off to 100 ms) up to a deadline. Locks belong to the open file
description, so two pins taken in one process are independent, as they are across processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Self

PIN_FILENAME: Final = ".pin"
"""The pin file inside every evictable cache folder."""

_POLL_MIN_S: Final = 0.005
_POLL_MAX_S: Final = 0.1


class LockTimeoutError(Exception):
    """A lock was not granted before its deadline."""


class Pin:
    """A shared lock on a folder's pin file: while held, the folder is not evicted.

    Not thread-safe; one owner. :meth:`release` is idempotent and also touches the pin
    file, so a model that was loaded for a long time counts as recently used.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, folder: Path, *, timeout_s: float, create: bool = False) -> Self:
        """Pin ``folder`` (blocking, up to ``timeout_s``); ``create`` makes the pin file.

        Raises ``FileNotFoundError`` when the folder (or, without ``create``, its pin file)
        does not exist, and :class:`LockTimeoutError` when an evictor holds it too long.
        """
        path = folder / PIN_FILENAME
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o644)
        try:
            _lock(fd, fcntl.LOCK_SH, timeout_s)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, path)

    @property
    def is_held(self) -> bool:
        return self._fd is not None

    def is_current(self) -> bool:
        """Whether the pinned file is still the one at :attr:`path` (not evicted meanwhile)."""
        if self._fd is None:
            return False
        try:
            here = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(self._fd)
        return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)

    def touch(self) -> None:
        """Mark the folder as used now (LRU order)."""
        if self._fd is not None:
            os.utime(self._fd)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.utime(fd)
        os.close(fd)  # closing the last descriptor drops the lock

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        # A pin dropped without release() must not leak its descriptor (and with it, keep
        # the folder pinned until the process exits).
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


@contextlib.contextmanager
def exclusive_lock(path: Path, *, timeout_s: float) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if missing), waiting up to ``timeout_s``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        _lock(fd, fcntl.LOCK_EX, timeout_s)
        yield
    finally:
        os.close(fd)


def try_exclusive(path: Path) -> int | None:
    """An fd holding an exclusive lock on ``path`` if nobody holds any lock on it, else None.

    The caller closes the fd (dropping the lock) when done. ``None`` also when the file
    does not exist.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _lock(fd: int, operation: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    delay = _POLL_MIN_S
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LockTimeoutError(f"lock not granted within {timeout_s:g} s") from None
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, _POLL_MAX_S)
