"""Subscriptions to the Redis store's channels that survive reconnects, and say so.

Each subscription holds one pooled connection. After every (re)subscription, once Redis has
confirmed it, the consumer first gets a catch-up (a RESYNC event for placements, everything
still pending or kept for activation requests and first responses), then the channel's
messages. While Redis is unreachable a subscription waits and reconnects with capped
exponential backoff (logged) instead of raising; an idle one pings Redis every
``keepalive_s`` and gives the connection up when no answer comes within ``timeout_s``, so a
silently dead connection is noticed. It ends when the store closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from control_plane.store.errors import StoreUnavailableError
from control_plane.store.redis.connection import CLOSE_ERRORS, OUTAGE_ERRORS, text
from foundation.records import FirstResponse, Placement, PlacementEvent, PlacementEventKind

__all__ = ["Subscriber", "first_response", "model_name", "placement_event", "resync"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_RESYNC = PlacementEvent(PlacementEventKind.RESYNC)

# What a subscription survives by reconnecting: an outage, including one met by the catch-up
# read it makes after subscribing.
_SUBSCRIPTION_ERRORS: tuple[type[Exception], ...] = (*OUTAGE_ERRORS, StoreUnavailableError)


class Subscriber:
    """Subscribes to channels of one Redis.

    Parameters:
        client: the store's client; each subscription takes a connection from its pool.
        address: the server, as logs show it (no password).
        timeout_s: the most subscribing, a catch-up or a keepalive ping may take.
        keepalive_s: how long a subscription stays quiet before it pings.
        backoff_initial_s: the first wait before reconnecting; each further failure doubles
            it (with jitter) up to ``backoff_max_s``.
        backoff_max_s: the longest wait between reconnect attempts.
        closed: set when the store closes; every subscription then ends.
    """

    def __init__(
        self,
        client: Redis,
        *,
        address: str,
        timeout_s: float,
        keepalive_s: float,
        backoff_initial_s: float,
        backoff_max_s: float,
        closed: asyncio.Event,
    ) -> None:
        self._client = client
        self._address = address
        self._timeout_s = timeout_s
        self._keepalive_s = keepalive_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._closed = closed
        # A subscription wakes this often to notice the close and to decide on keepalive pings.
        self._poll_s = min(keepalive_s, 1.0)

    async def listen(
        self,
        channel: str,
        *,
        what: str,
        on_connect: Callable[[], Awaitable[list[_T]]],
        decode: Callable[[str], _T | None],
    ) -> AsyncGenerator[_T, None]:
        """Messages on ``channel``, decoded, surviving reconnects.

        After every (re)subscription, confirmed by Redis, first yields what ``on_connect``
        returns, which tells the consumer to catch up on what it may have missed.
        """
        failures = 0
        delay_s = 0.0
        while not self._closed.is_set():
            pubsub = self._client.pubsub()
            try:
                async with asyncio.timeout(self._timeout_s):
                    await pubsub.subscribe(channel)
                    # Wait for Redis's confirmation: only then will a change made after the
                    # consumer's catch-up read be delivered here.
                    while (await pubsub.get_message(timeout=self._timeout_s)) is None:
                        pass
                    catch_up = await on_connect()
                if failures:
                    logger.info(
                        "%s subscription reconnected to %s after %d failed attempts",
                        what,
                        self._address,
                        failures,
                        extra={"channel": channel, "failures": failures},
                    )
                failures = 0
                for item in catch_up:
                    yield item
                async with contextlib.aclosing(self._messages(pubsub)) as messages:
                    async for data in messages:
                        decoded = decode(data)
                        if decoded is not None:
                            yield decoded
                return  # only when the store closed
            except _SUBSCRIPTION_ERRORS as exc:
                if self._closed.is_set():
                    return
                failures += 1
                delay_s = self._backoff_s(failures)
                logger.warning(
                    "%s subscription to %s failed (attempt %d): %s; reconnecting in %.2f s",
                    what,
                    self._address,
                    failures,
                    str(exc) or type(exc).__name__,
                    delay_s,
                    extra={"channel": channel, "failures": failures},
                )
            finally:
                await self._close_pubsub(pubsub)
            # Sleep, but wake at once when the store closes.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_s):
                    await self._closed.wait()

    async def _messages(self, pubsub: PubSub) -> AsyncGenerator[str, None]:
        """Payloads arriving on ``pubsub`` until the store closes; raises when Redis is gone.

        Pings when idle for ``keepalive_s``: a connection whose server vanished without
        closing it would otherwise look like a quiet channel forever.
        """
        loop = asyncio.get_running_loop()
        last_heard = loop.time()
        ping_sent_at: float | None = None
        while not self._closed.is_set():
            async with asyncio.timeout(self._poll_s + self._timeout_s):
                message = await pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=self._poll_s
                )
            now = loop.time()
            if message is not None:
                last_heard, ping_sent_at = now, None
                if message["type"] == "message":
                    yield text(message["data"])
            elif ping_sent_at is not None:
                if now - ping_sent_at > self._timeout_s:
                    raise TimeoutError(f"no answer to a keepalive ping within {self._timeout_s} s")
            elif now - last_heard >= self._keepalive_s:
                async with asyncio.timeout(self._timeout_s):
                    await pubsub.ping()
                ping_sent_at = now

    async def _close_pubsub(self, pubsub: PubSub) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
        except CLOSE_ERRORS as exc:
            # The connection is usually broken already; it is dropped either way.
            logger.debug("closing a subscription connection failed: %r", exc)

    def _backoff_s(self, failures: int) -> float:
        # Capped exponential backoff with jitter, so replicas that lost Redis together do
        # not all come back in the same instant.
        ceiling = min(self._backoff_max_s, self._backoff_initial_s * 2 ** min(failures - 1, 30))
        return random.uniform(ceiling / 2, ceiling)


async def resync() -> list[PlacementEvent]:
    """The catch-up of a placement subscription: re-read every placement."""
    return [_RESYNC]


def placement_event(data: str) -> PlacementEvent | None:
    """A placement event as the scripts publish it; None (logged) for anything else."""
    try:
        doc = orjson.loads(data)
        return PlacementEvent(
            PlacementEventKind(doc["kind"]), Placement.from_json(doc["placement"])
        )
    except (ValueError, KeyError, TypeError):
        # Someone else published on our channel; dropping it loses nothing of ours.
        logger.warning("ignoring a malformed placement event: %.200r", data)
        return None


def first_response(data: str) -> FirstResponse | None:
    """A first response as published; None (logged) for anything else."""
    try:
        return FirstResponse.from_json(orjson.loads(data))
    except (ValueError, TypeError):
        logger.warning("ignoring a malformed first response: %.200r", data)
        return None


def model_name(data: str) -> str:
    """An activation request: the model's name, as published."""
    return data
