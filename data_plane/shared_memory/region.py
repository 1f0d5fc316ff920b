"""One registered system shared-memory region: the object a key names under ``/dev/shm``,
opened once, and the window of it the client registered.

The object is read and written with ``preadv``/``pwritev`` on its descriptor, not through a
mapping: a client that shrinks its object after registering it would make a mapped read
past the new end raise SIGBUS and kill the server, where ``preadv`` only comes back short.
Every access is checked against the registered window first, so nothing outside it is read
or written.

A region counts the requests using it (`acquire`, `release`): unregistering one mid-request
(`retire`) closes its descriptor only once the last of them is done, so that no request
ever reads or writes through a descriptor number the process has since given to another
file.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from data_plane.errors import InvalidArgumentError
from data_plane.shared_memory.errors import RegionBoundsError, RegionOpenError

SHM_ROOT: Final = Path("/dev/shm")
"""Where Linux keeps POSIX shared-memory objects; the only folder keys may name files in."""
_NAME_MAX: Final = 255
# Not following links (a link in /dev/shm could point anywhere) and not blocking on a FIFO
# someone put there; the registry checks the object is a regular file once it is open.
_OPEN_FLAGS: Final = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def object_name(key: str) -> str | None:
    """The file name under `SHM_ROOT` that a POSIX shared-memory key names, read as glibc's
    ``shm_open`` reads it (leading slashes dropped); None when the key names no such file:
    empty, ``.`` or ``..``, holding another slash or a NUL, or too long."""
    name = key.lstrip("/")
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        return None
    try:
        if len(os.fsencode(name)) > _NAME_MAX:
            return None
    except UnicodeError:
        return None
    return name


class SystemRegion:
    """A registered region: ``byte_size`` bytes from ``offset`` in the object ``key`` names.

    Reads and writes block (they copy memory); callers run large ones off the event loop.
    """

    __slots__ = ("_fd", "_lock", "_retired", "_users", "byte_size", "key", "name", "offset")

    def __init__(self, *, name: str, key: str, offset: int, byte_size: int, fd: int) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._fd = fd
        self._lock = threading.Lock()
        self._users = 0
        self._retired = False

    @classmethod
    def open(cls, *, name: str, key: str, offset: int, byte_size: int) -> SystemRegion:
        """Open the object ``key`` names and check the window fits it.

        Raises RegionOpenError (Triton's text) when the key names nothing that opens
        directly under `SHM_ROOT` (links, folders and paths are refused), RegionBoundsError
        when ``offset + byte_size`` passes the end of the object (anything but a regular
        file has no bytes) or ``byte_size`` is 0.
        """
        file_name = object_name(key)
        if file_name is None:
            raise RegionOpenError(key=key)
        try:
            root = os.open(SHM_ROOT, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            raise RegionOpenError(key=key) from None
        try:
            # Relative to the folder's descriptor, with no slash in the name: the file is
            # looked up in /dev/shm and nowhere else.
            fd = os.open(file_name, _OPEN_FLAGS, dir_fd=root)
        except OSError:
            raise RegionOpenError(key=key) from None
        finally:
            os.close(root)
        try:
            info = os.fstat(fd)
            # Anything else that opens (a FIFO) holds no bytes to register, as Triton finds.
            size = info.st_size if stat.S_ISREG(info.st_mode) else 0
            if offset + byte_size > size:
                raise RegionBoundsError(
                    f"failed to register shared memory region '{name}': invalid args"
                )
            if byte_size == 0:
                raise RegionBoundsError(
                    f"failed to register shared memory region '{name}': its byte_size is 0"
                )
        except BaseException:
            os.close(fd)
            raise
        return cls(name=name, key=key, offset=offset, byte_size=byte_size, fd=fd)

    def check_window(self, offset: int, byte_size: int) -> None:
        """Refuse a tensor's place that is not inside the region, with Triton's texts (an
        empty place is refused too, as Triton refuses it at offset 0)."""
        if offset >= self.byte_size:
            raise RegionBoundsError(f"Invalid offset for shared memory region: '{self.name}'")
        if byte_size == 0 or offset + byte_size > self.byte_size:
            raise RegionBoundsError(
                f"Invalid offset + byte size for shared memory region: '{self.name}'"
            )

    def read(self, offset: int, byte_size: int) -> npt.NDArray[np.uint8]:
        """A copy of ``byte_size`` bytes at ``offset`` in the region."""
        self._check_inside(offset, byte_size)
        buffer = np.empty(byte_size, dtype=np.uint8)
        view = buffer.data
        done = 0
        while done < byte_size:
            count = os.preadv(self._fd, [view[done:]], self.offset + offset + done)
            if count == 0:
                raise InvalidArgumentError(
                    f"shared memory region '{self.name}' ends before its registered size: "
                    f"its object '{self.key}' was made smaller after it was registered"
                )
            done += count
        return buffer

    def write(self, offset: int, data: npt.NDArray[Any] | bytes) -> None:
        """Write ``data`` (bytes, or an array's raw bytes in C order) at ``offset`` in the
        region."""
        view = memoryview(data) if isinstance(data, bytes) else data.reshape(-1).view(np.uint8).data
        self._check_inside(offset, len(view))
        done = 0
        while done < len(view):
            done += os.pwritev(self._fd, [view[done:]], self.offset + offset + done)

    def _check_inside(self, offset: int, byte_size: int) -> None:
        # The last guard of the rule that nothing outside the window is touched, whatever
        # a caller checked before.
        if offset < 0 or byte_size < 0 or offset + byte_size > self.byte_size:
            raise RegionBoundsError(
                f"{byte_size} bytes at offset {offset} do not fit shared memory region "
                f"'{self.name}' of {self.byte_size} bytes"
            )

    def acquire(self) -> None:
        """Count one more request using the region (the registry calls this under its lock,
        so a region it hands out is never retired yet)."""
        with self._lock:
            self._users += 1

    def release(self) -> None:
        """One request is done with the region; the last one closes a retired region."""
        with self._lock:
            self._users -= 1
            if self._retired and self._users == 0:
                self._close()

    def retire(self) -> None:
        """The region is unregistered: close it now, or when its last request is done."""
        with self._lock:
            self._retired = True
            if self._users == 0:
                self._close()

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
