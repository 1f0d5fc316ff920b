"""What the node cache needs from the data plane's settings, as one frozen value."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

MIB: Final = 2**20


@dataclass(frozen=True)
class CacheSettings:
    """The node cache's folder, bound and transfer knobs.

    Built once from ``DataPlaneSettings`` in ``__main__``; ``__post_init__`` checks ranges
    the way the settings validators do, so a bad value fails at start, not at first fetch.
    """

    root: Path
    """The node-local cache folder (``--cache-dir`` / ``ZEROSERVE_CACHE_DIR``)."""
    max_bytes: int
    """Bound on the cache's size (``ZEROSERVE_CACHE_MAX_BYTES``); LRU eviction keeps it."""
    part_size_bytes: int = 8 * MIB
    """Size of one ranged GET."""
    concurrency: int = 8
    """Ranged GETs in flight at once, across all fetches of this process."""
    connect_timeout_s: float = 5.0
    """How long to wait for a TCP connection to the store."""
    read_timeout_s: float = 30.0
    """How long to wait for the store's next bytes on an open connection."""
    lock_timeout_s: float = 600.0
    """How long to wait for another process fetching the same model (or evicting)."""
    max_attempts: int = 3
    """Attempts per request (botocore's standard retries) and per part (body streaming)."""
    verify_checksums: bool = True
    """Check each object against its stored checksum or MD5 ETag (size is always checked)."""

    def __post_init__(self) -> None:
        if self.max_bytes <= 0:
            raise ValueError("cache max_bytes must be positive")
        if not 64 * 1024 <= self.part_size_bytes <= 5 * 1024 * MIB:
            raise ValueError("part_size_bytes must be between 64 KiB and 5 GiB")
        if not 1 <= self.concurrency <= 256:
            raise ValueError("concurrency must be between 1 and 256")
        if min(self.connect_timeout_s, self.read_timeout_s, self.lock_timeout_s) <= 0:
            raise ValueError("timeouts must be positive")
        if not 1 <= self.max_attempts <= 20:
            raise ValueError("max_attempts must be between 1 and 20")
