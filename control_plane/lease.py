"""Only one control plane acts: a lease with expiry in the state store.

Every replica runs ``Lease.run``: it tries to take or renew the lease every third of its
lifetime. The holder acts (activations from the store, reaper, autoscaler); the others serve
the admin API only and take over once the holder's lease expires (it stopped renewing: it
died, or lost the store). ``is_acting`` turns false by itself when the last successful renewal
is older than the lease's lifetime, so a holder cut off from the store stops acting no later
than the others may start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from control_plane.metrics import ControlPlaneMetrics
from control_plane.store.base import StateStore

__all__ = ["Lease"]

logger = logging.getLogger(__name__)

# A renewal is counted from when it was sent, not answered, so a slow answer cannot stretch
# our view of the lease past the store's.
_SAFETY = 0.9


class Lease:
    """This replica's claim to act.

    Parameters:
        holder: this replica's unique id.
        ttl_s: the lease's lifetime; renewed every ``renew_s``.
    """

    def __init__(
        self,
        store: StateStore,
        holder: str,
        *,
        ttl_s: float,
        renew_s: float,
        metrics: ControlPlaneMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if renew_s >= ttl_s:
            raise ValueError("the lease must be renewed more often than it expires")
        self._store = store
        self.holder = holder
        self._ttl_s = ttl_s
        self._renew_s = renew_s
        self._metrics = metrics
        self._clock = clock
        self._valid_until = 0.0
        self._was_acting = False
        self._acquired = asyncio.Event()

    @property
    def is_acting(self) -> bool:
        """True while this replica holds an unexpired lease."""
        return self._clock() < self._valid_until

    async def wait_acting(self) -> None:
        """Return once this replica has held the lease at least once."""
        await self._acquired.wait()

    async def renew(self) -> bool:
        """One attempt at taking or renewing the lease; whether we hold it now."""
        sent = self._clock()
        try:
            held = await self._store.try_acquire_lease(self.holder, self._ttl_s)
        except Exception as exc:
            logger.warning("lease renewal failed: %s", exc)
            held = False
            # Keep what we had: the lease is still ours until it expires.
        else:
            self._valid_until = sent + self._ttl_s * _SAFETY if held else 0.0
        self._note()
        return held

    async def run(self) -> None:
        """Take and renew the lease until cancelled."""
        while True:
            await self.renew()
            await asyncio.sleep(self._renew_s)

    async def release(self) -> None:
        """Give the lease up (at shutdown) so another replica takes over at once."""
        was_acting = self.is_acting
        self._valid_until = 0.0
        self._was_acting = False
        if self._metrics is not None:
            self._metrics.is_acting.set(0)
        if not was_acting:
            return
        logger.info("releasing the control-plane lease")
        try:
            await self._store.release_lease(self.holder)
        except Exception as exc:
            logger.warning("could not release the lease: %s", exc)

    def _note(self) -> None:
        is_acting = self.is_acting
        if is_acting != self._was_acting:
            if is_acting:
                logger.info("acting: %s holds the control-plane lease", self.holder)
                self._acquired.set()
            else:
                logger.warning("not acting: %s does not hold the lease", self.holder)
            self._was_acting = is_acting
        if self._metrics is not None:
            self._metrics.is_acting.set(1 if is_acting else 0)
