"""Shared memory between the server and one stub process: an anonymous file both map.

Each stub has two arenas, one per direction; only one side writes an arena (it allocates
its blocks) and the other only reads. An arena is a ``memfd`` the server creates and
hands to the stub when it starts it: no name in ``/dev/shm`` to leak, no size limit of a
container's ``/dev/shm`` mount, and the memory goes back to the system once both
processes closed it (a crashed stub frees its side by dying).

The writer grows the arena in place (``ftruncate``) when a message needs more room than is
free, up to a bound; offsets stay valid, so blocks already handed out keep their place.
The reader maps again whenever a block reaches past what it mapped. Mappings are never
closed explicitly: a numpy view may still point into an old one, and Python keeps a
mapping alive until its last view is gone.

Standard library only, as everything the stub imports before numpy.
"""

from __future__ import annotations

import mmap
import os
import threading
from typing import Final

ALIGNMENT: Final = 64
"""Every block starts at a multiple of this (a cache line; enough for any dtype)."""


class ArenaFullError(Exception):
    """A block would take the arena past its size bound."""

    def __init__(self, *, needed: int, limit: int) -> None:
        super().__init__(
            f"tensors need {needed} bytes of shared memory, more than the {limit} bytes "
            "one direction of a Python model instance may use"
        )
        self.needed = needed
        self.limit = limit


class Arena:
    """One memfd, mapped; the writer side also allocates blocks in it.

    Parameters:
        fd: the memfd (owned: :meth:`close` closes it).
        limit_bytes: the size the writer may grow it to.
    """

    def __init__(self, fd: int, *, limit_bytes: int) -> None:
        self.fd = fd
        self.limit_bytes = limit_bytes
        self._size = os.fstat(fd).st_size
        self._map = mmap.mmap(fd, self._size) if self._size else None
        # Sliced for every block: one view of the mapping, not a new one per block.
        self._bytes = memoryview(self._map) if self._map is not None else None
        # Free ranges as offset -> length, kept coalesced; only the writer uses them.
        self._free: dict[int, int] = {0: self._size} if self._size else {}
        self._used: dict[int, int] = {}
        # In a stub several threads write (response senders, BLS calls) and the channel's
        # reader frees; the server's side is used from its event loop alone.
        self._lock = threading.Lock()

    @classmethod
    def create(cls, name: str, *, size_bytes: int, limit_bytes: int) -> Arena:
        """A new arena of ``size_bytes`` (the server side; the fd is close-on-exec, so
        only a child started with it in ``pass_fds`` inherits it)."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size_bytes)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, limit_bytes=limit_bytes)

    @property
    def size_bytes(self) -> int:
        """Bytes mapped now."""
        return self._size

    @property
    def used_bytes(self) -> int:
        """Bytes in allocated blocks (writer side)."""
        return sum(self._used.values())

    def allocate(self, nbytes: int) -> int:
        """The offset of a new block of ``nbytes`` (writer side), growing the arena if
        needed; raises :class:`ArenaFullError` past the bound."""
        length = max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)
        with self._lock:
            offset = self._take(length)
            if offset is None:
                self._grow(length)
                offset = self._take(length)
                assert offset is not None  # _grow added a free range of at least `length`
            self._used[offset] = length
            return offset

    def free(self, offset: int) -> None:
        """Give back the block at ``offset`` (writer side); unknown offsets are ignored,
        so that a block is freed at most once whatever the message order."""
        with self._lock:
            length = self._used.pop(offset, None)
            if length is None:
                return
            end = offset + length
            following = self._free.pop(end, None)
            if following is not None:
                length += following
            for start, free_length in self._free.items():
                if start + free_length == offset:
                    self._free[start] = free_length + length
                    return
            self._free[offset] = length

    def free_all(self) -> None:
        """Give back every block (writer side)."""
        with self._lock:
            self._used.clear()
            self._free = {0: self._size} if self._size else {}

    def view(self, offset: int, nbytes: int) -> memoryview:
        """The bytes of a block, mapping the arena again if it grew past this mapping."""
        end = offset + nbytes
        if end > self._size:
            self._remap(os.fstat(self.fd).st_size)
            if end > self._size:
                raise ValueError(
                    f"block [{offset}, {end}) lies outside the shared memory of {self._size} bytes"
                )
        assert self._bytes is not None
        return self._bytes[offset:end]

    def close(self) -> None:
        """Close the fd and drop this side's mapping (views still held keep it alive)."""
        self._map = None
        self._bytes = None
        self._free.clear()
        self._used.clear()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _take(self, length: int) -> int | None:
        for start, free_length in self._free.items():
            if free_length >= length:
                del self._free[start]
                if free_length > length:
                    self._free[start + length] = free_length - length
                return start
        return None

    def _grow(self, length: int) -> None:
        # The free range at the end, if any, is extended rather than stranded.
        tail = next((s for s, n in self._free.items() if s + n == self._size), None)
        have = self._free[tail] if tail is not None else 0
        new_size = max(self._size * 2, self._size + length - have, ALIGNMENT)
        if new_size > self.limit_bytes:
            new_size = self._size + length - have
            if new_size > self.limit_bytes:
                raise ArenaFullError(needed=self.used_bytes + length, limit=self.limit_bytes)
        old_size = self._size
        os.ftruncate(self.fd, new_size)
        self._remap(new_size)
        if tail is not None:
            self._free[tail] = new_size - tail
        else:
            self._free[old_size] = new_size - old_size

    def _remap(self, size: int) -> None:
        self._map = mmap.mmap(self.fd, size) if size else None
        self._bytes = memoryview(self._map) if self._map is not None else None
        self._size = size
