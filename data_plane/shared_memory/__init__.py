"""Triton's shared-memory extensions, free of any transport: the registries of system (POSIX,
``/dev/shm``) shared-memory regions and of CUDA ones (this server has no CUDA runtime: see
`cuda`), with the errors Triton gives.

Modules: `region` (one region: opening its key safely, bounds, reads and writes), `registry`
(the regions by name, bounded), `cuda`, `errors`.

One server holds one `SystemSharedMemory`, on its handlers (``handlers.shared_memory.system``,
see ``data_plane.handlers.shared_memory``): every transport must use that same object, so that
a region registered over HTTP serves gRPC requests and the other way round. A transport
calls, with its request's fields as plain values:

- ``register(name, key, offset, byte_size)`` (``None`` back; raises the errors below);
- ``unregister(name)``, ``unregister()`` for all (an unknown name is not an error);
- ``status(name)`` / ``status()``: a list of `RegionStatus` (name, key, offset, byte_size),
  sorted by name; RegionNotFoundError for an unknown name;

and the same three on ``handlers.shared_memory.cuda`` (`CudaSharedMemory`: register takes
the raw IPC handle bytes, device id and byte size, and always refuses here; status entries are
`CudaRegionStatus`). Infer requests need nothing extra: inputs and requested outputs whose
``parameters`` hold ``shared_memory_region`` (with ``shared_memory_offset`` and
``shared_memory_byte_size``) are read and written by the infer handler.

Errors and Triton's kinds (HTTP status / gRPC code), as Triton 2.51 answers:

====================================  ===========  ==================
RegionExistsError                     400          ALREADY_EXISTS
RegionNotFoundError                   404          NOT_FOUND
RegionBoundsError, RegionLimitError   400          INVALID_ARGUMENT
(any other InvalidArgumentError)      400          INVALID_ARGUMENT
RegionOpenError                       500          INTERNAL
SharedMemoryRequestError              500          INTERNAL
OutputRegionTooSmallError             500          INTERNAL
====================================  ===========  ==================
"""

from __future__ import annotations

from data_plane.shared_memory.cuda import CudaRegionStatus, CudaSharedMemory
from data_plane.shared_memory.errors import (
    OutputRegionTooSmallError,
    RegionBoundsError,
    RegionExistsError,
    RegionLimitError,
    RegionNotFoundError,
    RegionOpenError,
    SharedMemoryRequestError,
)
from data_plane.shared_memory.region import SHM_ROOT, SystemRegion, object_name
from data_plane.shared_memory.registry import DEFAULT_MAX_REGIONS, RegionStatus, SystemSharedMemory

__all__ = [
    "DEFAULT_MAX_REGIONS",
    "SHM_ROOT",
    "CudaRegionStatus",
    "CudaSharedMemory",
    "OutputRegionTooSmallError",
    "RegionBoundsError",
    "RegionExistsError",
    "RegionLimitError",
    "RegionNotFoundError",
    "RegionOpenError",
    "RegionStatus",
    "SharedMemoryRequestError",
    "SystemRegion",
    "SystemSharedMemory",
    "object_name",
]
