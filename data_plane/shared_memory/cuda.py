"""CUDA shared memory on a server that registers no CUDA regions: Triton's ``cudasharedmemory``
extension answered as Triton 2.51 answers it on a machine without GPUs.

Registering CUDA IPC handles needs the CUDA runtime in the server; until it has one, every
registration fails as Triton's does when it cannot open a handle, the status lists nothing,
and unregistering succeeds (there is nothing to unregister). The server's metadata does not
list ``cuda_shared_memory``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from data_plane.errors import InvalidArgumentError
from data_plane.shared_memory.errors import RegionNotFoundError


@dataclass(frozen=True, slots=True)
class CudaRegionStatus:
    """A registered CUDA region as the status APIs list it."""

    name: str
    device_id: int
    byte_size: int


class CudaSharedMemory:
    """The CUDA shared-memory registry of a server without CUDA: always empty."""

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> NoReturn:
        """Refuse: no CUDA here. Raises InvalidArgumentError with Triton's text."""
        raise InvalidArgumentError(
            "failed to register shared memory region: invalid args "
            "(this server has no CUDA runtime to open CUDA IPC handles with)"
        )

    def unregister(self, name: str | None = None) -> None:
        """Nothing is ever registered, so nothing to do (an unknown name is no error)."""

    def status(self, name: str | None = None) -> list[CudaRegionStatus]:
        """No regions; RegionNotFoundError for any ``name``."""
        if name is not None:
            raise RegionNotFoundError(region=name, kind="cuda")
        return []
