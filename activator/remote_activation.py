"""Asking a control plane elsewhere for an activation, through the state store.

An activator apart from the acting control plane (a cluster's, or an embedded replica that
does not hold the lease) cannot wait on the activation itself: it publishes a request
(``store.request_activation``) and its buffered requests wait for the placement. If the
model's load fails for good, the control plane marks its record failed, and
:class:`StoreActivate` notices on its next look: the burst is then answered at once with
the reason, instead of waiting out its deadline for a replica that will not come.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, Self

from activator.settings import ActivatorSettings
from foundation.errors import ModelFailedError
from foundation.records import ModelRecord, Placement

__all__ = ["ActivationRequests", "StoreActivate"]

logger = logging.getLogger(__name__)


class ActivationRequests(Protocol):
    """What :class:`StoreActivate` needs of the state store; ``StateStore`` has it."""

    async def request_activation(self, model: str) -> None: ...

    async def get_model(self, name: str) -> ModelRecord | None: ...

    async def list_placements(self, model: str | None = None) -> list[Placement]: ...


class StoreActivate:
    """The buffer's ``Activate`` over the store: request, then watch the model's record.

    Returns once the model has a placement, is no longer registered, or ``give_up_s``
    passed (the buffered requests' own deadlines then decide); raises
    ``ModelFailedError`` once its record says its load failed for good. Looks every
    ``poll_s``; a store that fails a look is asked again at the next.
    """

    def __init__(self, store: ActivationRequests, *, poll_s: float, give_up_s: float) -> None:
        self._store = store
        self._poll_s = poll_s
        self._give_up_s = give_up_s

    @classmethod
    def from_settings(cls, store: ActivationRequests, settings: ActivatorSettings) -> Self:
        """Looking every ``activation_poll_s``, until shortly before the buffer's own bound
        on the call (``activation_timeout_s``) would cut it short."""
        poll_s = settings.activation_poll_s
        return cls(
            store, poll_s=poll_s, give_up_s=max(0.0, settings.activation_timeout_s - 2 * poll_s)
        )

    async def __call__(self, model: str) -> None:
        await self._store.request_activation(model)
        loop = asyncio.get_running_loop()
        until = loop.time() + self._give_up_s
        while loop.time() < until:
            try:
                record = await self._store.get_model(model)
                if record is None:
                    return
                if record.failure is not None:
                    raise ModelFailedError(
                        model=model,
                        reason=record.failure.reason,
                        failed_at=record.failure.failed_at,
                    )
                if await self._store.list_placements(model):
                    return
            except ModelFailedError:
                raise
            except Exception as exc:
                logger.debug("looking at %s's activation failed: %s", model, exc)
            await asyncio.sleep(self._poll_s)
