"""Rolling a pool over to a new Revision without dropping the old one's pods.

A changed pod template (image, env, resources) stamps a new Revision, which Knative makes
the latest and which starts at zero pods; new workers come from it. Knative scales a
Revision that is no longer routed to zero whatever its ``min-scale``, which would take the
previous Revision's pods, and every model loaded there, away at once. So each older Revision
that still has running pods stays in the Service's traffic at 0 % (requests never go through
Knative; being named keeps it reachable, ``manifests.pin_revisions``): its pods stay workers
until the control plane stops them, like any worker, and once it has no pod left it is
dropped from the traffic.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from control_plane.backends.knative.api import KubeApi
from control_plane.backends.knative.manifests import pin_revisions, pool_selector
from control_plane.backends.knative.pods import PodView, read_pods

__all__ = ["Rollover"]

logger = logging.getLogger(__name__)


class Rollover:
    """Which older Revisions of a pool stay routed, and unrouting them once they are empty."""

    def __init__(self, api: KubeApi, *, default_port: int) -> None:
        self._api = api
        self._default_port = default_port

    async def kept(self, pool: str, latest: str) -> tuple[str, ...]:
        """Revisions of ``pool`` other than ``latest`` that still have running pods."""
        listed = await self._api.list_pods(pool_selector(pool))
        pods = read_pods(listed, default_port=self._default_port)
        older = {p.revision for p in pods if p.revision and not p.is_gone} - {latest}
        return tuple(sorted(r for r in older if r))

    async def release(
        self,
        manifest: dict[str, Any],
        pinned: tuple[str, ...],
        revision: str,
        pods: Iterable[PodView],
    ) -> tuple[str, ...]:
        """``pinned`` without ``revision`` once none of ``pods`` of it runs, the Service
        re-applied without it (Knative then retires it); ``pinned`` as it was otherwise."""
        if revision not in pinned or any(p.revision == revision and not p.is_gone for p in pods):
            return pinned
        remaining = tuple(r for r in pinned if r != revision)
        await self._api.apply_service(pin_revisions(manifest, remaining))
        logger.info("revision %s has no pod left; no longer routed", revision)
        return remaining
