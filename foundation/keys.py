"""API keys: what a key record holds, how a key is made, read and checked.

A key as a caller sends it is ``zs_<id>_<secret>``: ``id`` is public (12 hex digits; logs,
the access log and the admin API name a key by it) and lets the activator find the record
without scanning; ``secret`` is 256 random bits that only the caller holds. The store keeps
the SHA-256 of the secret, never the secret: a salted slow hash buys nothing for a random
256-bit secret, and a fast one keeps the check far below a millisecond. The comparison
takes the same time whatever the guess (``hmac.compare_digest``).

The control plane writes key records (``zeroserve keys create``); the activator reads them.
They live here, below both, as the other records do.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Self

__all__ = [
    "ALL_KEYS",
    "ApiKeyRecord",
    "KeyLimits",
    "NewKey",
    "allows_model",
    "hash_secret",
    "new_key",
    "parse_key",
    "secret_matches",
]

KEY_PREFIX: Final = "zs_"
ALL_KEYS: Final = "*"
"""What a revocation subscription yields after it (re)subscribes: forget every cached key,
since revocations may have been missed meanwhile."""

_ID_HEX_DIGITS = 12
_KEY_PATTERN = re.compile(r"zs_([0-9a-f]{12})_([A-Za-z0-9_-]{20,128})")


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A key's quotas; None is no limit."""

    requests_per_s: float | None = None
    """Sustained request rate (a token bucket refilled at this rate)."""
    burst: int | None = None
    """Requests the bucket holds: how many may come at once after a quiet spell; default
    the rate rounded up (at least 1)."""
    max_in_flight: int | None = None
    """Requests of this key being served at once."""
    activations_per_hour: int | None = None
    """Cold starts requests with this key may trigger in any hour."""

    @property
    def bucket_size(self) -> int:
        """The token bucket's capacity (only meaningful with ``requests_per_s``)."""
        if self.burst is not None:
            return self.burst
        rate = self.requests_per_s or 1.0
        return max(1, int(-(-rate // 1)))

    @property
    def is_unlimited(self) -> bool:
        return (
            self.requests_per_s is None
            and self.max_in_flight is None
            and self.activations_per_hour is None
        )


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """An API key as the store keeps it: everything but the secret."""

    id: str
    """Public, unique; part of the key as sent."""
    name: str
    """The owner's label for it."""
    secret_sha256: str
    """Hex SHA-256 of the secret."""
    models: tuple[str, ...] = ("*",)
    """Model names or shell-style patterns (``*``, ``resnet-*``) the key may call."""
    limits: KeyLimits = field(default_factory=KeyLimits)
    created_at: float = 0.0
    """Wall-clock seconds since the epoch."""
    expires_at: float | None = None
    """Wall-clock seconds since the epoch after which the key is refused; None never."""
    revoked_at: float | None = None
    """When it was revoked (refused from then on); None while it is not."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        return cls(
            **{
                **doc,
                "models": tuple(doc.get("models", ("*",))),
                "limits": KeyLimits(**doc.get("limits", {})),
            }
        )

    def is_valid_at(self, now: float) -> bool:
        """Neither revoked nor expired at wall-clock ``now``."""
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or now < self.expires_at


@dataclass(frozen=True, slots=True)
class NewKey:
    """A key just made: the token to show its owner once, and what the store keeps."""

    token: str
    key_id: str
    secret_sha256: str


def new_key() -> NewKey:
    """A fresh random key."""
    key_id = secrets.token_hex(_ID_HEX_DIGITS // 2)
    secret = secrets.token_urlsafe(32)
    return NewKey(f"{KEY_PREFIX}{key_id}_{secret}", key_id, hash_secret(secret))


def parse_key(token: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a key in the ``zs_<id>_<secret>`` form; None for anything else."""
    match = _KEY_PATTERN.fullmatch(token)
    if match is None:
        return None
    return match.group(1), match.group(2)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def secret_matches(secret: str, record: ApiKeyRecord) -> bool:
    """Whether ``secret`` is ``record``'s, compared in constant time."""
    return hmac.compare_digest(hash_secret(secret), record.secret_sha256)


def allows_model(patterns: tuple[str, ...], model: str) -> bool:
    """Whether a key with these model patterns may call ``model`` (case-sensitive)."""
    for pattern in patterns:
        if pattern == "*" or pattern == model:
            return True
        if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(model, pattern):
            return True
    return False
