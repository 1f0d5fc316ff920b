"""Which API key a request carries, and whether it is good: a cache of the store's key
records, kept honest by the store's revocation events.

A key is looked up by its public id (``foundation.keys``) the first time it is seen and
then served from memory for ``ttl_s``; unknown ids are remembered too, so a flood of made-up
keys costs the store one lookup per id and ``ttl_s``. A revocation evicts the key at once on
every activator (the store publishes it); after a reconnect of that subscription, when
revocations may have been missed, the whole cache goes. The TTL bounds how stale a cached
key can be should the subscription itself fail.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from activator.errors import (
    ForbiddenModelError,
    KeyLookupUnavailableError,
    UnauthenticatedError,
)
from foundation.errors import ZeroserveError
from foundation.keys import ALL_KEYS, ApiKeyRecord, allows_model, parse_key, secret_matches

__all__ = ["KeyRing", "KeySource", "bearer_token"]

logger = logging.getLogger(__name__)

_MISSING = "missing API key: send 'Authorization: Bearer <key>'"
_NOT_BEARER = "the Authorization header must use the Bearer scheme: 'Bearer <key>'"
_MALFORMED = "malformed API key: zeroserve keys look like zs_<id>_<secret>"
_REFUSED = "invalid API key: unknown, revoked or expired"
"""One text for all three, so that a guess learns nothing about which ids exist."""


class KeySource(Protocol):
    """Where key records come from; the state store has both."""

    async def get_key(self, key_id: str) -> ApiKeyRecord | None: ...

    def subscribe_key_revocations(self) -> AsyncIterator[str]: ...


def bearer_token(header: str | None) -> str:
    """The key in an ``Authorization`` value; UnauthenticatedError when there is none."""
    if header is None or not header.strip():
        raise UnauthenticatedError(reason=_MISSING)
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthenticatedError(reason=_NOT_BEARER)
    return token.strip()


class KeyRing:
    """Authenticates keys against the store, through a bounded cache.

    Parameters:
        source: the store.
        ttl_s: how long a looked-up record (or an unknown id) is trusted without the store.
        max_entries: bound on cached ids; past it the oldest entry goes.
        retry_after_s: carried by the 503 when the store cannot be asked.
        resubscribe_delay_s: pause before subscribing again after the subscription failed.
        wall: wall-clock seconds (key expiry is a wall-clock time).
        clock: monotonic seconds, for the cache's TTL.
    """

    def __init__(
        self,
        source: KeySource,
        *,
        ttl_s: float,
        max_entries: int,
        retry_after_s: int,
        resubscribe_delay_s: float = 1.0,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._retry_after_s = retry_after_s
        self._resubscribe_delay_s = resubscribe_delay_s
        self._wall = wall
        self._clock = clock
        self._cache: dict[str, tuple[ApiKeyRecord | None, float]] = {}
        self._lookups: dict[str, asyncio.Future[ApiKeyRecord | None]] = {}
        self._epoch = 0
        """Bumped by every revocation event: a lookup that straddles one is not cached."""

    async def authenticate(self, header: str | None) -> ApiKeyRecord:
        """The valid key record that ``header`` (an ``Authorization`` value) names.

        Raises:
            UnauthenticatedError: no key, a malformed one, or one unknown, revoked or
                expired, or whose secret is wrong.
            KeyLookupUnavailableError: the store did not answer (and the key is not cached).
        """
        parsed = parse_key(bearer_token(header))
        if parsed is None:
            raise UnauthenticatedError(reason=_MALFORMED)
        key_id, secret = parsed
        record = await self._record(key_id)
        if (
            record is None
            or not secret_matches(secret, record)
            or not record.is_valid_at(self._wall())
        ):
            raise UnauthenticatedError(reason=_REFUSED)
        return record

    def still_valid(self, record: ApiKeyRecord) -> bool:
        """Whether a key authenticated earlier (a long stream's) is neither revoked since
        (as far as this activator has heard) nor expired now."""
        if not record.is_valid_at(self._wall()):
            return False
        cached = self._cache.get(record.id)
        return cached is None or (cached[0] is not None and cached[0].revoked_at is None)

    @staticmethod
    def authorize(record: ApiKeyRecord, model: str) -> None:
        """Raises ForbiddenModelError unless ``record`` may call ``model``."""
        if not allows_model(record.models, model):
            raise ForbiddenModelError(model=model, key_id=record.id)

    async def run(self) -> None:
        """Follow the store's revocations until cancelled, resubscribing on failure."""
        while True:
            try:
                async for key_id in self._source.subscribe_key_revocations():
                    self._revoked(key_id)
                logger.warning("key revocation subscription ended; subscribing again")
            except Exception:
                logger.exception("key revocation subscription failed; subscribing again")
            # Whatever was missed meanwhile: trust nothing cached.
            self._revoked(ALL_KEYS)
            await asyncio.sleep(self._resubscribe_delay_s)

    def _revoked(self, key_id: str) -> None:
        self._epoch += 1
        if key_id == ALL_KEYS:
            self._cache.clear()
        else:
            # Remembered as revoked (not just dropped), so that streams opened with it
            # (:meth:`still_valid`) end too.
            cached = self._cache.get(key_id)
            if cached is not None and cached[0] is not None:
                self._cache[key_id] = (None, cached[1])
            else:
                self._cache.pop(key_id, None)

    async def _record(self, key_id: str) -> ApiKeyRecord | None:
        now = self._clock()
        cached = self._cache.get(key_id)
        if cached is not None and now - cached[1] < self._ttl_s:
            return cached[0]
        pending = self._lookups.get(key_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[ApiKeyRecord | None] = asyncio.get_running_loop().create_future()
        self._lookups[key_id] = future
        epoch = self._epoch
        try:
            record = await self._source.get_key(key_id)
        except Exception as exc:
            reason = exc.message if isinstance(exc, ZeroserveError) else type(exc).__name__
            error = KeyLookupUnavailableError(reason=reason, retry_after_s=self._retry_after_s)
            future.set_exception(error)
            # Retrieved here, so that a lookup nobody else awaited logs no warning.
            future.exception()
            raise error from None
        finally:
            del self._lookups[key_id]
        future.set_result(record)
        if epoch == self._epoch:
            self._remember(key_id, record, now)
        return record

    def _remember(self, key_id: str, record: ApiKeyRecord | None, now: float) -> None:
        self._cache.pop(key_id, None)
        if len(self._cache) >= self._max_entries:
            del self._cache[next(iter(self._cache))]
        self._cache[key_id] = (record, now)
