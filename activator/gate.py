"""What every model request passes before anything else: its API key, then its key's
quotas. Transport-free: the HTTP middleware and the gRPC router both call it.

In order: the key is authenticated (401 / UNAUTHENTICATED), its rate and in-flight limits
let the request in (429 / RESOURCE_EXHAUSTED), then, once the model is known, the key's
scope must cover it (403 / PERMISSION_DENIED, checked before the model's registration, so
an answer says nothing about models outside the scope), and a request that would start the
model from zero spends one of the key's activations (one per cold start, however many
requests arrive for it at once). An anonymous caller never buffers a
request or starts a worker.

With auth off (an explicit setting) every request passes as anonymous, unlimited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from activator.keys import KeyRing
from activator.quotas import Quotas
from foundation.keys import ApiKeyRecord

__all__ = ["CURRENT_KEY_ID", "Gate", "Pass"]

CURRENT_KEY_ID: ContextVar[str | None] = ContextVar("zeroserve_key_id", default=None)
"""The public id of the key of the gRPC call being served (None before it is accepted, and
with auth off), for whatever logs the call: set by the gRPC router for the call's task.
HTTP requests carry it in their scope's state instead (``activator.auth``)."""


@dataclass(slots=True)
class Pass:
    """A request let in: its key (None with auth off) and how to give its place back."""

    key: ApiKeyRecord | None
    _release: Callable[[], None] | None = None

    @property
    def key_id(self) -> str | None:
        """The key's public id (what logs may name)."""
        return None if self.key is None else self.key.id

    def release(self) -> None:
        """End the request's in-flight place (idempotent)."""
        release, self._release = self._release, None
        if release is not None:
            release()


_ANONYMOUS = Pass(None)


class Gate:
    """Keys and quotas for every transport.

    Parameters:
        ring: the key cache; None turns auth off (every request passes, unlimited).
        quotas: the keys' limits.
    """

    def __init__(self, ring: KeyRing | None, quotas: Quotas) -> None:
        self.ring = ring
        self.quotas = quotas
        self._charging: dict[str, asyncio.Future[bool]] = {}
        """Models whose activation charge is being decided, and whether it was granted."""

    @property
    def is_enabled(self) -> bool:
        return self.ring is not None

    async def admit(self, authorization: str | None) -> Pass:
        """Authenticate ``authorization`` (the header's value) and take the key's rate and
        in-flight limits; release the pass when the request ends.

        Raises:
            UnauthenticatedError: no valid key.
            KeyLookupUnavailableError: the store could not be asked.
            QuotaExceededError: over the rate or in-flight limit.
        """
        if self.ring is None:
            return _ANONYMOUS
        key = await self.ring.authenticate(authorization)
        release = await self.quotas.admit(key)
        return Pass(key, release)

    def authorize(self, admitted: Pass, model: str) -> None:
        """Raises ForbiddenModelError unless the pass's key may call ``model``."""
        if admitted.key is not None:
            KeyRing.authorize(admitted.key, model)

    def still_valid(self, admitted: Pass) -> bool:
        """Whether the pass's key is still good (for the later requests of a stream)."""
        if self.ring is None or admitted.key is None:
            return True
        return self.ring.still_valid(admitted.key)

    async def activation(
        self, admitted: Pass, model: str, would_activate: Callable[[str], bool]
    ) -> None:
        """Spend one of the key's activations when a request of ``model`` would start it
        (``would_activate``: no ready replica, no activation under way).

        One charge per cold start: a request that finds another request's charge for the
        same model being decided (the shared counters answer over the network) waits for
        it, and joins the cold start that charge pays for, free as joining any cold start
        is; if that charge was refused, the next request charges its own key.

        Raises:
            QuotaExceededError: none left this hour.
        """
        if admitted.key is None:
            return
        while would_activate(model):
            pending = self._charging.get(model)
            if pending is None:
                break
            if await asyncio.shield(pending):
                return
        else:
            return
        decided: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._charging[model] = decided
        granted = False
        try:
            await self.quotas.charge_activation(admitted.key)
            granted = True
        finally:
            del self._charging[model]
            decided.set_result(granted)
