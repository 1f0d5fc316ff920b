"""The system shared-memory regions one server holds, by name: Triton's
``systemsharedmemory`` extension without its transport."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Final

from data_plane.shared_memory.errors import (
    RegionExistsError,
    RegionLimitError,
    RegionNotFoundError,
)
from data_plane.shared_memory.region import SystemRegion

DEFAULT_MAX_REGIONS: Final = 1024
"""How many regions a server holds at most: each keeps a descriptor open."""


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """A registered system region as the status APIs list it."""

    name: str
    key: str
    offset: int
    byte_size: int


class SystemSharedMemory:
    """Registered system shared-memory regions (at most ``max_regions``).

    Safe to call from any thread: HTTP and gRPC transports share one registry, as Triton's
    do, so a region registered through one serves requests on the other.
    """

    def __init__(self, *, max_regions: int = DEFAULT_MAX_REGIONS) -> None:
        self._max_regions = max_regions
        self._regions: dict[str, SystemRegion] = {}
        self._lock = threading.Lock()

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register ``byte_size`` bytes from ``offset`` of the object ``key`` names as
        ``name``. Raises RegionExistsError, RegionLimitError, RegionOpenError (the key names
        no regular file directly under /dev/shm) or RegionBoundsError (the window passes
        the object's end, or is empty)."""
        with self._lock:
            if name in self._regions:
                raise RegionExistsError(region=name)
            if len(self._regions) >= self._max_regions:
                raise RegionLimitError(region=name, limit=self._max_regions)
            self._regions[name] = SystemRegion.open(
                name=name, key=key, offset=offset, byte_size=byte_size
            )

    def unregister(self, name: str | None = None) -> None:
        """Unregister ``name``, or every region when None; an unknown name is no error (as
        in Triton). Requests already using a region finish with it."""
        with self._lock:
            if name is None:
                retired = list(self._regions.values())
                self._regions.clear()
            else:
                region = self._regions.pop(name, None)
                retired = [] if region is None else [region]
        for region in retired:
            region.retire()

    def status(self, name: str | None = None) -> list[RegionStatus]:
        """Every region, by name; or only ``name``, RegionNotFoundError if unknown."""
        with self._lock:
            if name is None:
                regions = [self._regions[n] for n in sorted(self._regions)]
            elif name in self._regions:
                regions = [self._regions[name]]
            else:
                raise RegionNotFoundError(region=name, kind="system")
        return [RegionStatus(r.name, r.key, r.offset, r.byte_size) for r in regions]

    def acquire(self, name: str) -> SystemRegion:
        """The region ``name``, counted as used until the caller calls its ``release``
        (unregistering it meanwhile closes it only then). RegionNotFoundError if unknown."""
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                raise RegionNotFoundError(region=name)
            region.acquire()
        return region

    def close(self) -> None:
        """Unregister every region (the server stops)."""
        self.unregister()
