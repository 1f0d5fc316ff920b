"""Choose a state store from its URL: SQLite (or ``memory``) for the embedded platform, Redis
for a cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from control_plane.store.base import StateStore
from control_plane.store.memory import MemoryStateStore
from control_plane.store.sqlite import SqliteStateStore, sqlite_path

if TYPE_CHECKING:
    from control_plane.store.redis.quotas import RedisQuotaCounters

__all__ = ["open_quota_counters", "open_state_store"]


def open_quota_counters(url: str, *, timeout_s: float) -> RedisQuotaCounters | None:
    """The API keys' quota counters every activator shares, for a store URL that names a
    shared store (Redis); None for a store of one process, whose activator counts alone.
    Connects lazily; the caller closes it."""
    if urlsplit(url).scheme not in ("redis", "rediss"):
        return None
    from control_plane.store.redis.quotas import RedisQuotaCounters

    return RedisQuotaCounters(url, timeout_s=timeout_s)


def open_state_store(
    url: str,
    *,
    subscriber_queue_max: int = 1024,
    traffic_ttl_s: float = 30.0,
    activation_pending_ttl_s: float = 30.0,
    timeout_s: float = 2.0,
) -> StateStore:
    """The store that ``url`` names; it connects lazily and the caller closes it.

    ``"memory"`` (or ``"memory://"``) gives a :class:`MemoryStateStore`;
    ``sqlite:///PATH`` a :class:`SqliteStateStore` on that file (``sqlite:////abs/path.db``
    for an absolute path); ``redis://host:port/db`` (or ``rediss://`` for TLS, as
    ElastiCache's in-transit encryption needs) gives a ``RedisStateStore``. Anything else
    raises ValueError.

    The keywords are the stores' bounds, normally taken from the control plane's settings.
    ``traffic_ttl_s`` and ``activation_pending_ttl_s`` apply to both stores;
    ``subscriber_queue_max`` to memory and SQLite (whose subscriptions are in process; Redis
    bounds a subscriber with its ``client-output-buffer-limit``), and ``timeout_s`` to Redis
    and SQLite (memory never waits).
    """
    if url in ("memory", "memory://"):
        return MemoryStateStore(
            subscriber_queue_max=subscriber_queue_max,
            traffic_ttl_s=traffic_ttl_s,
            activation_pending_ttl_s=activation_pending_ttl_s,
        )
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        return SqliteStateStore(
            sqlite_path(url),
            timeout_s=timeout_s,
            subscriber_queue_max=subscriber_queue_max,
            traffic_ttl_s=traffic_ttl_s,
            activation_pending_ttl_s=activation_pending_ttl_s,
        )
    if scheme in ("redis", "rediss"):
        # Imported here so that the embedded platform runs without redis-py installed.
        from control_plane.store.redis import RedisStateStore

        return RedisStateStore(
            url,
            timeout_s=timeout_s,
            traffic_ttl_s=traffic_ttl_s,
            activation_pending_ttl_s=activation_pending_ttl_s,
        )
    # The URL itself is left out of the message: it may carry a password.
    shown = f"scheme {scheme!r}" if scheme else "no scheme"
    raise ValueError(
        f"unsupported state store URL ({shown}): use 'memory', 'sqlite:///PATH', "
        "'redis://host:port/db' or 'rediss://host:port/db'"
    )
