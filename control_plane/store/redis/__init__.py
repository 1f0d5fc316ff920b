"""The Redis state store, shared by every control-plane and activator replica of a cluster.

``store`` holds ``RedisStateStore`` (the calls, their time bound and what is retried);
``scripts`` the key layout and the Lua scripts that change several keys atomically;
``subscriptions`` the pub/sub channels that survive reconnects; ``connection`` the pool and
what counts as an outage.
"""

from control_plane.store.redis.store import RedisStateStore

__all__ = ["RedisStateStore"]
