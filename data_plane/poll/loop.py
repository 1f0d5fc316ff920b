"""The poll task: scan, decide, apply, record; then sleep the interval and do it again.

Scans never overlap their own loads: the next one starts an interval after the last one's
loads and unloads ended, as in Triton. A model counts for the server's readiness once its
first load attempt in this mode ended, so that a model being loaded does not take a
serving server out of rotation, but one that fails does (Triton's strict readiness).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from data_plane.errors import ZeroserveError
from data_plane.poll.decide import PollState, RetryPolicy, after, decide
from data_plane.poll.scan import scan_models
from data_plane.settings import DataPlaneSettings, ModelControlMode
from data_plane.storage import StorageUri

logger = logging.getLogger(__name__)

RETRY_MAX_S = 300.0
"""Longest wait before a model whose load failed, unchanged, is tried again."""


class PolledRepository(Protocol):
    """What the poller needs of the model repository."""

    async def load(self, name: str) -> object: ...

    async def unload(self, name: str) -> None: ...

    def require(self, names: Iterable[str]) -> None: ...


class RepositoryPoller:
    """Keeps ``repository`` in step with the model folders under ``root``.

    ``clock`` gives monotonic seconds and ``scan`` reads the folder (both replaceable in
    tests); :meth:`poll_once` runs one round, :meth:`start` the task that runs one every
    ``interval_s``, :meth:`close` stops it.
    """

    def __init__(
        self,
        repository: PolledRepository,
        root: Path,
        *,
        interval_s: float,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        scan: Callable[[Path], dict[str, str | None]] = scan_models,
    ) -> None:
        self._repository = repository
        self._root = root
        self._interval_s = interval_s
        self._retry = retry or RetryPolicy(base_s=interval_s, max_s=max(RETRY_MAX_S, interval_s))
        self._clock = clock
        self._scan = scan
        self._state = PollState()
        self._task: asyncio.Task[None] | None = None

    @property
    def state(self) -> PollState:
        return self._state

    async def poll_once(self) -> None:
        """Scan once and apply what changed; a repository that cannot be listed changes
        nothing (its models keep serving)."""
        try:
            scan = await asyncio.to_thread(self._scan, self._root)
        except OSError as exc:
            logger.warning("cannot scan the model repository %s: %s", self._root, exc)
            return
        plan = decide(self._state, scan, self._clock())
        unloaded = [name for name in plan.unloads if await self._unload(name)]
        loaded = {name: await self._load(name) for name in plan.loads}
        self._repository.require(plan.loads)
        now = self._clock()
        self._state = after(
            self._state, scan, loaded=loaded, unloaded=unloaded, now=now, retry=self._retry
        )

    async def _load(self, name: str) -> bool:
        try:
            await self._repository.load(name)
        except ZeroserveError as exc:
            logger.warning("poll: load of %s failed: %s", name, exc.message)
            return False
        except Exception:
            logger.exception("poll: load of %s failed", name)
            return False
        logger.info("poll: %s loaded", name)
        return True

    async def _unload(self, name: str) -> bool:
        try:
            await self._repository.unload(name)
        except Exception:
            logger.exception("poll: unload of %s failed", name)
            return False
        logger.info("poll: %s left the repository and was unloaded", name)
        return True

    def start(self) -> None:
        """Poll every ``interval_s`` in a task of its own, until :meth:`close`."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="repository-poll")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.poll_once()
            except Exception:
                # A bug in one round must not end polling; the next round starts afresh.
                logger.exception("poll of the model repository failed")

    async def close(self) -> None:
        """Stop polling; a round in progress is cancelled (its load finishes in the
        repository, which the server's shutdown drains)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def open_poller(
    settings: DataPlaneSettings, repository: PolledRepository, root: StorageUri
) -> RepositoryPoller | None:
    """In poll mode, a poller over the repository folder ``root`` that has loaded what it
    holds and polls on; None in the other modes."""
    if settings.model_control_mode is not ModelControlMode.POLL:
        return None
    if root.is_s3:
        # The settings refuse this already; a repository built otherwise is a bug.
        raise ValueError("poll mode needs a local model repository")
    poller = RepositoryPoller(repository, root.local_path, interval_s=settings.repository_poll_s)
    await poller.poll_once()
    poller.start()
    return poller
