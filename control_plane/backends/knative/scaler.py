"""Sizing a pool: the ``min-scale`` annotation of its Revision, the only knob the knative
backend turns.

Patching the Revision (not the Service's template) changes its PodAutoscaler without
stamping a new Revision, so no pod is rolled (shared/research/knative-kserve.md §1.6). Every
change is a read-modify-write guarded by the Revision's ``resourceVersion``: a concurrent
writer (another control-plane replica during a lease hand-over) makes the patch fail with
409, and the change is applied again to what is there now instead of overwriting it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from control_plane.backends.knative.api import KubeApi
from control_plane.backends.knative.errors import KubeApiError, KubeConflictError
from control_plane.backends.knative.manifests import min_scale_of, min_scale_patch

__all__ = ["RevisionScaler"]

logger = logging.getLogger(__name__)

_CONFLICT_ATTEMPTS = 5
_REVISION_POLL_S = 0.2


class RevisionScaler:
    """Reads and sets Revisions' ``min-scale``; one change per Revision at a time.

    Calls wait while the Revision does not exist yet (Knative creates it shortly after the
    Service is applied): callers bound them with a timeout.
    """

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self._locks: dict[str, asyncio.Lock] = {}

    async def add(self, revision: str, delta: int, *, ceiling: int) -> int:
        """Move ``min-scale`` by ``delta`` within 0..``ceiling``; the new value."""
        return await self.change(revision, lambda current: current + delta, ceiling=ceiling)

    async def change(self, revision: str, change: Callable[[int], int], *, ceiling: int) -> int:
        """Set ``min-scale`` to ``change(current)`` within 0..``ceiling``; the new value."""
        lock = self._locks.setdefault(revision, asyncio.Lock())
        async with lock:
            for _ in range(_CONFLICT_ATTEMPTS):
                document = await self._get(revision)
                current = min_scale_of(document)
                target = min(max(change(current), 0), ceiling)
                if target == current:
                    return current
                version = document.get("metadata", {}).get("resourceVersion")
                try:
                    await self._api.patch_revision(
                        revision, min_scale_patch(target, resource_version=version)
                    )
                except KubeConflictError:
                    continue
                logger.info("revision %s: min-scale %d -> %d", revision, current, target)
                return target
        raise KubeApiError(
            operation=f"scale revision {revision}",
            status=409,
            reason=f"it kept changing under us ({_CONFLICT_ATTEMPTS} attempts)",
        )

    async def _get(self, revision: str) -> dict[str, Any]:
        while True:
            document = await self._api.get_revision(revision)
            if document is not None:
                return document
            await asyncio.sleep(_REVISION_POLL_S)
