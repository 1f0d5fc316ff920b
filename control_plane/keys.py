"""API keys for the model endpoints: made, listed and revoked here, checked by the
activators (``activator.keys``). Free of HTTP: the admin API's key routes call this.

A key is shown once, when it is made; the store keeps its public id and the hash of its
secret. Revoking keeps the record (marked, for the listing) and publishes the revocation,
which every activator applies at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from control_plane.errors import KeyNotFoundError
from control_plane.store.base import StateStore, StoreConflictError
from foundation.keys import ApiKeyRecord, KeyLimits, new_key

__all__ = ["KeyService"]

_CREATE_ATTEMPTS = 3
"""A fresh id colliding with a stored one (48 random bits) is retried this often."""


class KeyService:
    """Creates, lists, reads and revokes API keys in ``store``."""

    def __init__(self, store: StateStore, *, wall: Callable[[], float] = time.time) -> None:
        self._store = store
        self._wall = wall

    async def create(
        self,
        name: str,
        *,
        models: Sequence[str] = ("*",),
        limits: KeyLimits | None = None,
        expires_at: float | None = None,
    ) -> tuple[str, ApiKeyRecord]:
        """A new key: (the key itself, to be shown once, and its stored record)."""
        for attempt in range(_CREATE_ATTEMPTS):
            made = new_key()
            record = ApiKeyRecord(
                id=made.key_id,
                name=name,
                secret_sha256=made.secret_sha256,
                models=tuple(models),
                limits=limits or KeyLimits(),
                created_at=self._wall(),
                expires_at=expires_at,
            )
            try:
                await self._store.create_key(record)
            except StoreConflictError:
                if attempt == _CREATE_ATTEMPTS - 1:
                    raise
                continue
            return made.token, record
        raise AssertionError("unreachable")

    async def list(self) -> list[ApiKeyRecord]:
        return await self._store.list_keys()

    async def get(self, key_id: str) -> ApiKeyRecord:
        record = await self._store.get_key(key_id)
        if record is None:
            raise KeyNotFoundError(key_id=key_id)
        return record

    async def revoke(self, key_id: str) -> ApiKeyRecord:
        """Revoke the key now (a second revoke changes nothing)."""
        record = await self._store.revoke_key(key_id, revoked_at=self._wall())
        if record is None:
            raise KeyNotFoundError(key_id=key_id)
        return record

    def now(self) -> float:
        """Wall-clock seconds since the epoch, as key times are."""
        return self._wall()

    def state(self, record: ApiKeyRecord) -> str:
        """``active``, ``expired`` or ``revoked``, now."""
        if record.revoked_at is not None:
            return "revoked"
        return "active" if record.is_valid_at(self._wall()) else "expired"
