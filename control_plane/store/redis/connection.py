"""Connecting to Redis: the pool, the time bound on each call, and what an outage is.

Every connection comes from one bounded pool with no retries inside redis-py: a pub/sub
connection that re-subscribed silently would hide lost events, and a replayed write could
change its answer (a create would report a conflict with itself). A call is retried once,
by ``bounded``, only when its caller says a replay gives the same outcome; subscriptions
reconnect on their own (``subscriptions``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis.exceptions
from redis.asyncio import Redis
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from control_plane.store.errors import StoreUnavailableError

__all__ = ["CLOSE_ERRORS", "OUTAGE_ERRORS", "bounded", "open_client", "redact", "text"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# What an outage looks like from redis-py and asyncio. ReadOnlyError is a replica answering
# after a failover; BusyLoadingError (a ConnectionError) is a server still loading its data.
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    TimeoutError,
    OSError,
)
# What closing a connection may raise; the connection is dropped either way.
CLOSE_ERRORS: tuple[type[Exception], ...] = (*OUTAGE_ERRORS, redis.exceptions.RedisError)


def open_client(
    url: str, *, max_connections: int, timeout_s: float
) -> tuple[BlockingConnectionPool, Redis]:
    """A connection pool for ``url`` and a client over it; neither connects until used."""
    pool: BlockingConnectionPool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        # Waiting for a free pooled connection is bounded too.
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        # No retries inside redis-py: see the module docstring. A pooled connection that
        # died while idle is still replaced before use (the pool checks it on checkout).
        retry=Retry(NoBackoff(), 0),
        # RESP2 on purpose: with RESP3, redis-py 8 turns on "maintenance notifications",
        # which skips that checkout check, so the first call on each pooled connection
        # after a Redis restart would fail. RESP2 also behaves alike across redis-py 5-8.
        protocol=2,
        decode_responses=True,
    )
    return pool, Redis(connection_pool=pool)


async def bounded(
    call: Callable[[], Awaitable[_T]],
    *,
    store: str,
    operation: str,
    timeout_s: float,
    replay_safe: bool = True,
) -> _T:
    """``call()`` within ``timeout_s``, an outage turned into StoreUnavailableError.

    A call whose replay cannot change its outcome is tried once more, within the same
    timeout, after a connection error: a pooled connection may have died while idle (a
    Redis restart or failover drops them all), and some redis-py versions hand such a
    connection out. The retry gets a fresh one.
    """
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            try:
                return await call()
            except redis.exceptions.ConnectionError:
                # Past the deadline, the retry would run unbounded: asyncio.timeout cancels
                # once, and some redis-py versions turn that cancellation into a
                # ConnectionError ("No connection available.").
                if not replay_safe or deadline.expired():
                    raise
                logger.debug("%s: connection error, trying once more", operation)
                return await call()
    except TimeoutError as exc:
        reason = f"no answer within {timeout_s} s"
        raise StoreUnavailableError(store=store, operation=operation, reason=reason) from exc
    except OUTAGE_ERRORS as exc:
        raise StoreUnavailableError(
            store=store, operation=operation, reason=str(exc) or type(exc).__name__
        ) from exc


def redact(url: str) -> str:
    """``url`` without its password, fit for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))


def text(value: bytes | str) -> str:
    """A reply or a message payload as text, whether or not it arrived decoded."""
    return value.decode() if isinstance(value, bytes) else value
