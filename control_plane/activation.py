"""Bringing models up: the activation orchestrator and its cold-start timelines.

An activation is asked for by the activator in this process (an ``activate(model)`` call), by
an activator elsewhere (``store.subscribe_activation_requests()``), by the admin API (``load``)
or by the autoscaler (more replicas). Requests for one model are de-duplicated: while an
activation of the model is under way, every further request joins it. Each activation runs as
its own named task with a deadline (``activation_timeout_s``), so a caller that gives up does
not cancel it for the others.

Every activation leaves a timeline in the store (the newest ``activations_kept`` per model)::

    {"id", "model", "generation", "trigger",
     "outcome": "ready" | "revived" | "woken" | "failed",
     "error", "is_permanent" (failed only: the load fails for good, the model is marked
     failed), "queued_at" (wall clock), "worker": {"id", "url", "started", "start_method"},
     "cache": "hit" | "miss" | "local" | "unknown", "bytes_fetched",
     "phases": [{"phase": "queued" | "worker_process" | "worker_ready" | "fetched"
                          | "engine_built" | "wake" | "ready" | "first_response",
                 "at_s": seconds since queued}, ...],
     "durations_s": {"worker", "worker_boot", "fetch", "engine", "load", "wake", "total",
                     "first_response"}}

While it runs, the timeline is already in the store with ``outcome`` ``running`` and a
``current`` phase (``queued``, ``worker_starting``, ``loading``), each begun phase appended to
``phases`` as it begins (and ``worker``'s ``id`` once the load goes to one; while the worker
downloads the files, ``bytes_fetched`` of ``bytes_total``, updated about every second), so that a
reader of the store (the admin API's ``follow``) sees an activation in course. At its end
the same record (by ``id``) is replaced by the finished timeline, which has no ``current``;
a successful one's ``phases`` are then rebuilt from what the placement measured, a failed
one keeps the phases begun, so its last one says where it failed.

When the activation started a worker and the backend timed its start (the local backend
does), ``worker_process`` is when its process existed (forked from the template, or
spawned) and ``durations_s.worker_boot`` the time from then to its first liveness answer;
``worker.start_method`` says which (``forked``, ``spawned``; absent for pods).

A ``woken`` activation woke a sleeping replica (an LLM engine kept asleep on its worker): its
``wake`` phase replaces ``engine_built`` and ``durations_s.wake`` replaces ``load``.

``cache`` and ``bytes_fetched`` are the worker's own answer to the load: ``hit`` (its node
cache held the files), ``miss`` (downloaded), ``local`` (a local folder, read in place);
``unknown`` when no load ran (a revived or woken replica) or the worker did not say (see
``worker_client``). ``fetched`` (and the fetch/engine split) appear when the worker said how
long getting the files took. ``first_response`` is added later, when an activator
reports (``store.subscribe_first_responses()``) that a request it buffered for the cold start
got its answer from the new replica; its duration, like ``total``, counts from ``queued``.
Activators report on their own wall clocks, so hosts are assumed to keep time (NTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from control_plane import backoff
from control_plane.errors import (
    ActivationBackoffError,
    ActivationTimeoutError,
    LoadFailedError,
    ModelNotFoundError,
    NoCapacityError,
)
from control_plane.metrics import ControlPlaneMetrics
from control_plane.placement import PlaceProgress, PlaceResult
from control_plane.settings import ControlPlaneSettings
from control_plane.store.base import StateStore, StoreConflictError
from foundation.errors import ModelFailedError, ZeroserveError
from foundation.records import FirstResponse, ModelFailure, ModelRecord, Placement

__all__ = ["Acting", "ActivationObserver", "Orchestrator", "ReplicaPlacer"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_ACTING_POLL_S = 0.2
"""How often a replica that does not act checks whether it does now."""

_SUCCESS = ("ready", "revived", "woken")
"""Outcomes of an activation that left a replica in place."""


class ReplicaPlacer(Protocol):
    """What the orchestrator needs of the placer (``may_evict`` False: a pre-warm, which
    takes only free room)."""

    async def place(
        self,
        model: ModelRecord,
        *,
        may_evict: bool = True,
        progress: PlaceProgress | None = None,
    ) -> PlaceResult: ...


class Probe(Protocol):
    """Whether the worker at ``url`` answers at all (one liveness probe)."""

    async def __call__(self, url: str) -> bool: ...


class Acting(Protocol):
    """Whether this control-plane replica acts now (holds the lease)."""

    @property
    def is_acting(self) -> bool: ...


class ActivationObserver(Protocol):
    """Told of every finished activation (CloudWatch's publisher, when it is on)."""

    def activation_finished(self, *, model: str, outcome: str, duration_s: float) -> None: ...


class Orchestrator:
    """De-duplicated, deadline-bound activations, each recorded as a timeline.

    Parameters:
        store: model records in; placements (via the placer) and timelines out.
        placer: puts replicas on workers.
        settings: ``activation_timeout_s``, ``activations_kept``, ``store_retry_s``.
        metrics: ``zeroserve_activation_duration_seconds`` and friends.
        acting: requests from the store are served only while this is true.
        probe: liveness of a placement's worker; an activator asks for a model only when it
            cannot use the placements it knows, so on such a request a placement whose
            worker does not answer is removed instead of handed back.
        observer: told of each finished activation, failed ones included.
    """

    def __init__(
        self,
        store: StateStore,
        placer: ReplicaPlacer,
        settings: ControlPlaneSettings,
        metrics: ControlPlaneMetrics,
        acting: Acting,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        probe: Probe | None = None,
        observer: ActivationObserver | None = None,
    ) -> None:
        self._probe = probe
        self._observer = observer
        self._store = store
        self._placer = placer
        self._settings = settings
        self._metrics = metrics
        self._acting = acting
        self._clock = clock
        self._wall = wall
        self._running: dict[str, set[asyncio.Task[Placement]]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._blocked: set[str] = set()
        self._closing: dict[str, asyncio.Task[None]] = {}
        """model -> the first response being recorded into its timeline."""
        self._backoff: dict[str, backoff.Backoff] = {}
        """model -> its activations' failures in a row for passing reasons."""
        self._policy = backoff.BackoffPolicy(
            initial_s=settings.activation_backoff_initial_s,
            max_s=settings.activation_backoff_max_s,
        )

    # ---- asking ----

    async def __call__(self, model: str) -> None:
        """The activator's ``Activate``: bring ``model`` up; returns once it is placed."""
        await self.activate(model, trigger="request")

    async def activate(self, model: str, *, trigger: str = "request") -> Placement:
        """A placement of ``model``: an existing one, the one being made, or a new one.

        Raises ``ModelNotFoundError``, ``ModelFailedError`` (its load failed for good; no
        activation starts), ``ActivationBackoffError`` (the last one failed for a passing
        reason and its backoff has not run out; an ``admin`` trigger does not wait),
        ``ActivationTimeoutError`` and the placer's errors.
        """
        if model in self._blocked:
            raise ModelNotFoundError(model=model)
        existing = await self._store.list_placements(model)
        if existing and trigger == "request" and self._probe is not None:
            existing = await self._live(existing)
        if existing:
            return existing[0]
        running = self._running.get(model)
        if not running and trigger != "admin":
            self._check_backoff(model)
        task = next(iter(running)) if running else self._start(model, trigger)
        # shield: a caller that gives up (its request timed out) leaves the activation to
        # the others waiting on it.
        return await asyncio.shield(task)

    async def _live(self, placements: list[Placement]) -> list[Placement]:
        """The placements whose worker answers; the others are removed from the store."""
        assert self._probe is not None
        answers = await asyncio.gather(*(self._probe(p.url) for p in placements))
        live = []
        for placement, is_live in zip(placements, answers, strict=True):
            if is_live:
                live.append(placement)
            else:
                logger.warning(
                    "placement of %s on %s does not answer; removing it",
                    placement.model,
                    placement.worker_id,
                )
                await self._store.remove_placement(placement.model, placement.worker_id)
        return live

    def add_replicas(self, model: str, count: int, *, trigger: str = "autoscaler") -> None:
        """Start ``count`` more replicas of ``model`` without waiting for them (none while
        its activations back off)."""
        if model in self._blocked:
            return
        if backoff.wait_s(self._backoff.get(model), self._clock()) > 0:
            return
        for _ in range(count):
            task = self._start(model, trigger)
            task.add_done_callback(_log_failure)

    def request(self, model: str, *, trigger: str = "request") -> None:
        """``activate`` without waiting (for requests that arrive through the store)."""
        task = asyncio.create_task(self._request(model, trigger), name=f"request-{model}")
        self._keep(task)

    def pending(self, model: str) -> int:
        """Activations of ``model`` under way."""
        return len(self._running.get(model, ()))

    def is_activating(self, model: str) -> bool:
        return bool(self._running.get(model))

    async def settle(self, model: str) -> None:
        """Wait for the activations of ``model`` under way to end, however they end."""
        tasks = list(self._running.get(model, ()))
        if tasks:
            await asyncio.wait(tasks)

    def block(self, model: str) -> None:
        """Refuse activations of ``model`` (it is being deleted) until ``unblock``."""
        self._blocked.add(model)

    def unblock(self, model: str) -> None:
        self._blocked.discard(model)

    def first_response(self, report: FirstResponse) -> None:
        """``record_first_response`` in the background, for reports that arrive through the
        store. While a report of the model is being recorded, others for it are dropped."""
        if report.model in self._closing:
            return
        task = asyncio.create_task(
            self._record_quietly(report), name=f"first-response-{report.model}"
        )
        self._closing[report.model] = task
        task.add_done_callback(lambda _: self._closing.pop(report.model, None))
        self._keep(task)

    # ---- serving the store's requests ----

    async def run(self) -> None:
        """Serve what activators publish in the store while acting: activation requests
        and first responses; runs until cancelled.

        The subscriptions are held only while this replica acts. An item seen while not
        acting ends its subscription; subscribing again once acting replays every request
        still pending (and first response still kept), so one made during a failover waits
        for the new acting replica, not for its pending period to lapse.
        """
        async with asyncio.TaskGroup() as group:
            group.create_task(
                self._follow(
                    "activation-request", self._store.subscribe_activation_requests, self.request
                ),
                name="activation-requests",
            )
            group.create_task(
                self._follow(
                    "first-response", self._store.subscribe_first_responses, self.first_response
                ),
                name="first-responses",
            )

    async def _follow(
        self,
        what: str,
        subscribe: Callable[[], AsyncIterator[_T]],
        handle: Callable[[_T], None],
    ) -> None:
        while True:
            if not self._acting.is_acting:
                await asyncio.sleep(_ACTING_POLL_S)
                continue
            items = subscribe()
            try:
                async for item in items:
                    if not self._acting.is_acting:
                        break
                    handle(item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("%s subscription failed: %s; resubscribing", what, exc)
                await asyncio.sleep(self._settings.store_retry_s)
            finally:
                aclose = getattr(items, "aclose", None)
                if aclose is not None:
                    with contextlib.suppress(Exception):
                        await aclose()

    async def close(self) -> None:
        """Cancel every activation under way."""
        tasks = [t for ts in self._running.values() for t in ts] + list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- running one ----

    def _start(self, model: str, trigger: str) -> asyncio.Task[Placement]:
        task = asyncio.create_task(self._activate(model, trigger), name=f"activate-{model}")
        self._running.setdefault(model, set()).add(task)

        def done(finished: asyncio.Task[Placement]) -> None:
            running = self._running.get(model)
            if running is not None:
                running.discard(finished)
                if not running:
                    del self._running[model]

        task.add_done_callback(done)
        return task

    def _check_backoff(self, model: str) -> None:
        state = self._backoff.get(model)
        wait = backoff.wait_s(state, self._clock())
        if state is not None and wait > 0:
            raise ActivationBackoffError(
                model=model, reason=state.reason, retry_after_s=backoff.retry_after_s(wait)
            )

    async def _request(self, model: str, trigger: str) -> None:
        try:
            await self.activate(model, trigger=trigger)
        except ZeroserveError as exc:
            logger.warning("activation of %s failed: %s", model, exc.message)

    async def _activate(self, model: str, trigger: str) -> Placement:
        queued = self._clock()
        timeline: dict[str, Any] = {
            "id": secrets.token_hex(6),
            "model": model,
            "generation": None,
            "trigger": trigger,
            "outcome": "running",
            "current": "queued",
            "error": None,
            "queued_at": self._wall(),
            "worker": None,
            "cache": "unknown",
            "bytes_fetched": None,
            "phases": [{"phase": "queued", "at_s": 0.0}],
            "durations_s": {},
        }
        logger.info("activating %s (%s)", model, trigger, extra={"model": model})
        is_stored = False

        async def progress(
            phase: str, worker_id: str | None = None, *, fetched: tuple[int, int] | None = None
        ) -> None:
            if fetched is not None:
                timeline["bytes_fetched"], timeline["bytes_total"] = fetched
            elif phase != timeline["current"]:
                timeline["current"] = phase
                at_s = round(self._clock() - queued, 6)
                timeline["phases"].append({"phase": phase, "at_s": at_s})
            if worker_id is not None:
                timeline["worker"] = {"id": worker_id}
            if is_stored:
                await self._store_quietly(self._store.update_activation(model, timeline))

        record = await self._store.get_model(model)
        if record is not None and record.failure is not None:
            # Not an activation: none starts until the registration changes or an
            # explicit load clears the failure.
            raise ModelFailedError(
                model=model, reason=record.failure.reason, failed_at=record.failure.failed_at
            )
        try:
            if record is None:
                raise ModelNotFoundError(model=model)
            timeline["generation"] = record.generation
            is_stored = await self._store_quietly(
                self._store.add_activation(model, timeline, keep=self._settings.activations_kept)
            )
            try:
                async with asyncio.timeout(self._settings.activation_timeout_s):
                    # A pre-warm is a guess about the next request: it never takes room
                    # from a model that is loaded now.
                    result = await self._placer.place(
                        record, may_evict=trigger != "prewarm", progress=progress
                    )
            except TimeoutError:
                raise ActivationTimeoutError(
                    model=model, timeout_s=self._settings.activation_timeout_s
                ) from None
        except Exception as exc:
            message = exc.message if isinstance(exc, ZeroserveError) else repr(exc)
            is_permanent = isinstance(exc, LoadFailedError) and exc.is_permanent
            timeline.pop("current", None)
            timeline.pop("bytes_total", None)
            timeline.update(outcome="failed", error=message, is_permanent=is_permanent)
            timeline["durations_s"] = {"total": round(self._clock() - queued, 6)}
            self._metrics.activations.labels("failed", trigger).inc()
            await self._record(model, timeline, is_stored=is_stored)
            logger.warning("activation of %s failed: %s", model, message, extra={"model": model})
            if record is not None and isinstance(exc, LoadFailedError) and is_permanent:
                failure = ModelFailure(reason=exc.worker_message, failed_at=self._wall())
                await self._mark_failed(record, failure)
                raise ModelFailedError(
                    model=model, reason=failure.reason, failed_at=failure.failed_at
                ) from exc
            # A pre-warm refused for want of free room says nothing about the model: the
            # request it guessed at may still evict to load it, and must not be backed off.
            is_guess_refused = trigger == "prewarm" and isinstance(exc, NoCapacityError)
            if (
                record is not None
                and not isinstance(exc, ModelNotFoundError)
                and not is_guess_refused
            ):
                self._backoff[model] = backoff.after_failure(
                    self._backoff.get(model), self._clock(), self._policy, message
                )
            raise
        self._backoff.pop(model, None)
        ready = self._clock()
        timeline.pop("current", None)
        timeline.pop("bytes_total", None)
        timeline["phases"] = [{"phase": "queued", "at_s": 0.0}]
        self._fill(timeline, result, queued, ready)
        await self._record(model, timeline, is_stored=is_stored)
        logger.info(
            "%s ready on %s in %.3f s (%s)",
            model,
            result.worker.id,
            ready - queued,
            timeline["outcome"],
            extra={"model": model, "worker": result.worker.id},
        )
        return result.placement

    async def _mark_failed(self, record: ModelRecord, failure: ModelFailure) -> None:
        """Record the failure on the generation that failed; a registration changed
        meanwhile (a new generation) keeps no failure, so it is tried as it is now."""
        try:
            await self._store.update_model(
                dataclasses.replace(record, failure=failure),
                expected_generation=record.generation,
            )
        except StoreConflictError:
            logger.info("%s changed while its load failed; not marking it failed", record.name)
        except Exception as exc:
            logger.warning("could not mark %s failed: %s", record.name, exc)
        else:
            logger.warning(
                "%s failed for good; no activation until its registration changes or an "
                "explicit load: %s",
                record.name,
                failure.reason,
                extra={"model": record.name},
            )

    def _fill(
        self, timeline: dict[str, Any], result: PlaceResult, queued: float, ready: float
    ) -> None:
        worker_s = result.worker_ready_at - queued
        load_s = result.loaded_at - result.worker_ready_at
        phases = timeline["phases"]
        durations: dict[str, float | None] = {"worker": round(worker_s, 6)}
        boot_s = result.worker.boot_s
        if result.is_worker_started and boot_s is not None:
            boot_s = min(boot_s, worker_s)
            phases.append({"phase": "worker_process", "at_s": round(worker_s - boot_s, 6)})
            durations["worker_boot"] = round(boot_s, 6)
        phases.append({"phase": "worker_ready", "at_s": round(worker_s, 6)})
        report = result.load
        cache = "unknown"
        if report is not None:
            cache = report.cache
            timeline["bytes_fetched"] = report.bytes_fetched
            if report.fetch_s is not None:
                fetch_s = min(report.fetch_s, load_s)
                phases.append({"phase": "fetched", "at_s": round(worker_s + fetch_s, 6)})
                durations["fetch"] = round(fetch_s, 6)
                durations["engine"] = round(load_s - fetch_s, 6)
            if report.bytes_fetched:
                self._metrics.activation_bytes.inc(report.bytes_fetched)
        if result.is_woken:
            phases.append({"phase": "wake", "at_s": round(result.loaded_at - queued, 6)})
            durations["wake"] = round(load_s, 6)
        else:
            phases.append({"phase": "engine_built", "at_s": round(result.loaded_at - queued, 6)})
            durations["load"] = round(load_s, 6)
        phases.append({"phase": "ready", "at_s": round(ready - queued, 6)})
        durations["total"] = round(ready - queued, 6)
        outcome = "revived" if result.is_revived else "woken" if result.is_woken else "ready"
        timeline.update(
            outcome=outcome,
            cache=cache,
            worker={
                "id": result.worker.id,
                "url": result.worker.url,
                "started": result.is_worker_started,
            },
            durations_s=durations,
        )
        if result.worker.start_method:
            timeline["worker"]["start_method"] = result.worker.start_method
        if result.evicted:
            timeline["evicted"] = list(result.evicted)
        if result.is_worker_started:
            self._metrics.worker_starts.inc()
        self._metrics.activations.labels(timeline["outcome"], timeline["trigger"]).inc()
        for phase, seconds in durations.items():
            if seconds is not None:
                self._metrics.activation_duration.labels(phase, cache).observe(seconds)

    async def record_first_response(self, report: FirstResponse) -> bool:
        """Add an activator's first response to the timeline of the activation that placed
        the replica that answered; whether a timeline took it.

        That timeline is the newest successful one on ``report.worker_id``. It takes the
        ``first_response`` phase unless it has one already (the first report wins) or it was
        ready before the activator asked for an activation (the activator had not seen the
        placement yet, so the request did not wait for this activation). Raises on store
        failure.
        """
        model = report.model
        # The placement that released the request is published before its activation is
        # recorded, so the report can overtake the timeline: let the activations end first.
        await self.settle(model)
        timeline = _released_by(await self._store.list_activations(model), report)
        if timeline is None:
            logger.debug("the first response of %s matches no open activation", model)
            return False
        # "ready" is read after the placement is published, so an activator can be answered
        # a hair earlier; the phase then goes at "ready", never before it.
        ready_s = timeline["durations_s"]["total"]
        at_s = round(max(report.responded_at - timeline["queued_at"], ready_s), 6)
        timeline["phases"].append({"phase": "first_response", "at_s": at_s})
        timeline["durations_s"]["first_response"] = at_s
        if not await self._store.update_activation(model, timeline):
            return False  # trimmed or deleted meanwhile
        self._metrics.activation_duration.labels("first_response", timeline["cache"]).observe(at_s)
        logger.info(
            "%s answered %.3f s after its activation was queued (activator %s)",
            model,
            at_s,
            report.activator_id,
            extra={"model": model, "activator": report.activator_id},
        )
        return True

    async def _record_quietly(self, report: FirstResponse) -> None:
        try:
            await self.record_first_response(report)
        except Exception as exc:
            # Only the timeline's last phase is lost; the report stays kept in the store and
            # is replayed to whichever replica subscribes next.
            logger.warning("could not record the first response of %s: %s", report.model, exc)

    async def _record(self, model: str, timeline: dict[str, Any], *, is_stored: bool) -> None:
        if self._observer is not None:
            self._observer.activation_finished(
                model=model,
                outcome=timeline["outcome"],
                duration_s=timeline["durations_s"]["total"],
            )
        try:
            # The running record may be gone (trimmed by newer ones, or never written while
            # the store was down): the finished one is then added afresh.
            if not is_stored or not await self._store.update_activation(model, timeline):
                await self._store.add_activation(
                    model, timeline, keep=self._settings.activations_kept
                )
        except Exception as exc:
            # The activation itself stands; only its record is lost.
            logger.warning("could not record the activation of %s: %s", model, exc)

    async def _store_quietly(self, write: Awaitable[object]) -> bool:
        """Run one write of a running timeline; False when it failed. A lost progress
        write costs only liveness of the record: the finished timeline is written anyway."""
        try:
            result = await write
        except Exception as exc:
            logger.debug("could not record the progress of an activation: %s", exc)
            return False
        return result is not False

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _released_by(timelines: list[dict[str, Any]], report: FirstResponse) -> dict[str, Any] | None:
    """The timeline (newest first in ``timelines``) that ``report`` closes, if any."""
    for timeline in timelines:
        worker = timeline.get("worker") or {}
        if timeline.get("outcome") not in _SUCCESS or worker.get("id") != report.worker_id:
            continue
        durations = timeline["durations_s"]
        if "first_response" in durations:
            return None
        ready_at = timeline["queued_at"] + durations["total"]
        if report.responded_at - report.waited_s > ready_at:
            return None
        return timeline
    return None


def _log_failure(task: asyncio.Task[Placement]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not isinstance(exc, ZeroserveError):
        logger.error("replica activation failed", exc_info=exc)
