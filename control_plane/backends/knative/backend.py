"""``KnativeBackend``: a pool is a Knative Service, its workers are the Service's ready pods.

Knative manages the pods (Deployment, scheduling, image pulls, GPU resources); the control
plane decides how many there are. Requests never go through Knative: the activator and the
placer talk to each pod's own IP and port, found by listing the pool's pods. So Knative's
autoscaler sees no traffic and keeps exactly ``min-scale`` pods, and the backend sets that
number on the pool's Revision (never on the Service, which would stamp a new Revision and
roll every pod):

- ``start_worker``: ``min-scale`` + 1, then wait for a new pod to become ready;
- ``stop_worker``: lower the pod's deletion cost so the ReplicaSet picks it, ``min-scale`` − 1
  on the Revision the pod belongs to (its ``serving.knative.dev/revision`` label), wait for
  the pod to go; delete it outright if Knative has not removed it in time;
- ``delete_pool``: delete the Service (its Revisions and pods go with it).

A changed pod template stamps a new Revision; the older ones keep their pods, and the models
there, while those run (``rollover``).

A pod that was ready once stays a worker while it runs, even when its readiness drops
(``/v2/health/ready`` fails once the data plane begins to shut down, before it stops
answering). It is lost when it is deleted or terminating, when its runtime container restarts
(the new process holds no model, so it comes back as a new worker), or when it fails
``worker_health_failures`` liveness probes in a row (then the backend deletes it and the
ReplicaSet replaces it). Lost workers are reported through ``WorkerLost``.

Pods outlive this process: every control-plane replica lists them, and the one that acts
next adopts them with their models (placements name pods, not processes). ``close`` stops
only this object's tasks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx

from control_plane.backends.base import PodBackend, PoolSpec, WorkerLost
from control_plane.backends.knative.api import KubeApi, create_api_client
from control_plane.backends.knative.errors import KnativeConfigError, KubeApiError
from control_plane.backends.knative.manifests import (
    deletion_cost_patch,
    make_service,
    pin_revisions,
    pool_selector,
    revision_name,
    service_name,
)
from control_plane.backends.knative.pods import PodView, read_pods
from control_plane.backends.knative.preflight import check_knative_config
from control_plane.backends.knative.rollover import Rollover
from control_plane.backends.knative.scaler import RevisionScaler
from control_plane.backends.knative.settings import KnativeSettings
from control_plane.errors import NoCapacityError, WorkerStartError
from control_plane.settings import ControlPlaneSettings
from control_plane.worker_client import probe_live, probe_round
from foundation.records import WorkerRecord, WorkerState

__all__ = ["KnativeBackend", "create_knative_backend"]

logger = logging.getLogger(__name__)

# Lowest int32: the ReplicaSet removes this pod before any other running, ready one.
_STOP_DELETION_COST = -(2**31)


@dataclass
class _Pool:
    spec: PoolSpec
    service: str
    revision: str
    """The latest Revision: where new workers come from."""
    manifest: dict[str, Any]
    pinned: tuple[str, ...] = ()
    """Older Revisions kept routed while they have pods."""
    waiters: collections.deque[asyncio.Future[WorkerRecord]] = field(
        default_factory=collections.deque
    )
    """Starts waiting for a new ready pod, oldest first."""


@dataclass
class _Worker:
    record: WorkerRecord
    pod: str
    is_stopping: bool = False
    failures: int = 0


def create_knative_backend(
    settings: ControlPlaneSettings, knative: KnativeSettings, *, on_worker_lost: WorkerLost
) -> KnativeBackend:
    """The backend with a Kubernetes client from ``knative``'s kubeconfig or in-cluster."""
    api = KubeApi(
        create_api_client(knative),
        namespace=knative.namespace,
        request_timeout_s=knative.request_timeout_s,
        threads=knative.api_threads,
    )
    return KnativeBackend(settings, knative, api, on_worker_lost=on_worker_lost)


class KnativeBackend(PodBackend):
    """Workers as pods of one Knative Service per pool.

    Parameters:
        settings: the control plane's: worker timeouts, health probes, storage allow-list.
        knative: pod templates per pool, namespaces, API timeouts, polling period.
        api: the Kubernetes calls (closed by ``close``).
        on_worker_lost: told about workers whose pod went away or stopped answering.
        wall: wall-clock seconds (a worker's ``started_at`` when its pod does not say).
    """

    def __init__(
        self,
        settings: ControlPlaneSettings,
        knative: KnativeSettings,
        api: KubeApi,
        *,
        on_worker_lost: WorkerLost,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._knative = knative
        self._api = api
        self._scaler = RevisionScaler(api)
        self._rollover = Rollover(api, default_port=knative.container_port)
        self._on_worker_lost = on_worker_lost
        self._wall = wall
        self._pools: dict[str, _Pool] = {}
        self._workers: dict[str, _Worker] = {}
        self._pods: dict[str, PodView] = {}
        self._starting: dict[str, int] = {}
        self._condemned: set[str] = set()
        """Workers lost to failed probes whose pods are being deleted: never re-adopted."""
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.worker_health_timeout_s),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            # Pods are reached inside the cluster: no proxy from the environment.
            trust_env=False,
        )
        self._refresh_lock = asyncio.Lock()
        self._is_config_checked = False
        self._is_closed = False
        self._refreshed = asyncio.Event()
        """Set (and replaced) after each pod listing."""
        self._wake = asyncio.Event()
        """Asks the poll loop for a listing now."""
        self._poll_task: asyncio.Task[None] | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- PodBackend ----

    async def ensure_pool(self, pool: PoolSpec) -> None:
        template = self._knative.pools.get(pool.name)
        if template is None:
            problem = (
                f"pool '{pool.name}' has no pod template in ZEROSERVE_KNATIVE_POOLS "
                f"(it has: {', '.join(sorted(self._knative.pools)) or 'none'})"
            )
            raise KnativeConfigError(problems=[problem], message=problem)
        manifest = make_service(
            pool, template, self._knative, allowed_storage=self._settings.allowed_storage
        )
        if not self._is_config_checked:
            await check_knative_config(
                self._api,
                [manifest],
                namespace=self._knative.knative_namespace,
                mode=self._knative.config_check,
            )
            self._is_config_checked = True
        name = service_name(pool.name, self._knative)
        revision = revision_name(manifest)
        kept = await self._rollover.kept(pool.name, revision)
        await self._api.apply_service(pin_revisions(manifest, kept))
        state = self._pools.get(pool.name)
        if state is None:
            state = self._pools[pool.name] = _Pool(pool, name, revision, manifest)
        state.spec, state.revision, state.manifest, state.pinned = pool, revision, manifest, kept
        logger.info(
            "pool %s: Knative Service %s applied (revision %s%s)",
            pool.name,
            name,
            revision,
            f"; older revisions kept while their pods run: {', '.join(kept)}" if kept else "",
        )
        await self._refresh()
        if self._poll_task is None:
            self._poll_task = asyncio.create_task(self._poll_loop(), name="knative-pods")
            self._health_task = asyncio.create_task(self._health_loop(), name="knative-health")

    async def start_worker(self, pool: str) -> WorkerRecord:
        state = self._pools.get(pool)
        if state is None:
            raise WorkerStartError(pool=pool, reason="unknown pool")
        if self._is_closed:
            raise WorkerStartError(pool=pool, reason="the backend is shutting down")
        count = len(self.list_workers(pool)) + self._starting.get(pool, 0)
        if count >= state.spec.max_workers:
            raise NoCapacityError(
                model="*", reason=f"pool '{pool}' is at its {state.spec.max_workers} workers"
            )
        self._starting[pool] = self._starting.get(pool, 0) + 1
        waiter: asyncio.Future[WorkerRecord] = asyncio.get_running_loop().create_future()
        state.waiters.append(waiter)
        timeout_s = self._settings.worker_start_timeout_s
        is_scaled = False
        try:
            async with asyncio.timeout(timeout_s):
                await self._scale(state, +1)
                is_scaled = True
                self._wake.set()
                record = await asyncio.shield(waiter)
            logger.info("worker %s ready at %s", record.id, record.url, extra={"worker": record.id})
            return record
        except TimeoutError:
            reason = self._why_not_started(state, timeout_s)
            raise WorkerStartError(pool=pool, reason=reason) from None
        except KubeApiError as exc:
            raise WorkerStartError(pool=pool, reason=exc.message) from None
        finally:
            self._starting[pool] -= 1
            with contextlib.suppress(ValueError):
                state.waiters.remove(waiter)
            if not waiter.done():
                waiter.cancel()
                if is_scaled:
                    # The pod asked for never came up for us: take the request back. A pod
                    # that is still pending goes first when the ReplicaSet shrinks.
                    self._spawn(self._unscale(state), f"unscale-{pool}")

    async def stop_worker(self, worker_id: str) -> None:
        worker = self._workers.get(worker_id)
        if worker is None:
            return
        worker.is_stopping = True
        state = self._pools.get(worker.record.pool)
        stop_s = self._settings.worker_stop_timeout_s
        pod = self._pods.get(worker.pod)
        # The pod's own Revision: after a template change it is an older one than the pool's.
        revision = pod.revision if pod is not None and pod.revision else None
        try:
            if state is not None:
                revision = revision or state.revision
                with contextlib.suppress(KubeApiError):
                    await self._api.patch_pod(worker.pod, deletion_cost_patch(_STOP_DELETION_COST))
                async with asyncio.timeout(stop_s):
                    await self._scaler.add(revision, -1, ceiling=state.spec.max_workers)
            if not await self._wait_until(lambda: self._is_leaving(worker.pod), stop_s):
                logger.warning(
                    "pod %s still runs %.0f s after its pool was scaled down; deleting it",
                    worker.pod,
                    stop_s,
                    extra={"worker": worker_id},
                )
                await self._api.delete_pod(worker.pod)
            # The pod drains its in-flight requests (the data plane's exit timeout) first.
            if not await self._wait_until(lambda: worker.pod not in self._pods, stop_s):
                logger.warning("pod %s is still terminating; not waiting longer", worker.pod)
            if state is not None and revision is not None:
                pinned = state.pinned
                state.pinned = await self._rollover.release(
                    state.manifest, pinned, revision, self._pods.values()
                )
                if state.pinned != pinned:
                    logger.info(
                        "pool %s: revision %s has no pod left", worker.record.pool, revision
                    )
        except (KubeApiError, TimeoutError) as exc:
            logger.warning("stopping worker %s: %s", worker_id, exc)
        finally:
            self._workers.pop(worker_id, None)
        logger.info("worker %s stopped", worker_id, extra={"worker": worker_id})

    async def delete_pool(self, pool: str) -> None:
        state = self._pools.pop(pool, None)
        workers = [w for w in self._workers.values() if w.record.pool == pool]
        for worker in workers:
            worker.is_stopping = True
        name = state.service if state is not None else service_name(pool, self._knative)
        if state is not None:
            for waiter in state.waiters:
                waiter.cancel()
        try:
            if await self._api.delete_service(name):
                logger.info("pool %s: Knative Service %s deleted", pool, name)
            gone = await self._wait_until(
                lambda: not any(p.pool == pool for p in self._pods.values()),
                self._settings.worker_stop_timeout_s,
            )
            if not gone:
                logger.warning("pool %s: pods still terminating; not waiting longer", pool)
        finally:
            for worker in workers:
                self._workers.pop(worker.record.id, None)

    def list_workers(self, pool: str | None = None) -> list[WorkerRecord]:
        return [
            w.record
            for w in self._workers.values()
            if not w.is_stopping and (pool is None or w.record.pool == pool)
        ]

    async def health(self, worker_id: str) -> bool:
        worker = self._workers.get(worker_id)
        if worker is None:
            return False
        return await probe_live(self._http, worker.record.url)

    def details(self, worker_id: str) -> dict[str, object]:
        worker = self._workers.get(worker_id)
        if worker is None:
            return {}
        doc: dict[str, object] = {"pod": worker.pod}
        pod = self._pods.get(worker.pod)
        if pod is not None:
            doc.update(
                node=pod.node,
                ip=pod.ip,
                revision=pod.revision,
                phase=pod.phase,
                ready=pod.is_ready,
            )
        return doc

    async def close(self) -> None:
        """Stop polling and probing. The pods stay: they belong to the cluster, and the next
        acting control-plane replica adopts them."""
        self._is_closed = True
        tasks = [t for t in (self._poll_task, self._health_task) if t is not None]
        tasks += list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for state in self._pools.values():
            for waiter in state.waiters:
                waiter.cancel()
        self._workers.clear()
        await self._http.aclose()
        await self._api.close()

    # ---- scaling ----

    async def _scale(self, state: _Pool, delta: int) -> int:
        return await self._scaler.add(state.revision, delta, ceiling=state.spec.max_workers)

    async def _unscale(self, state: _Pool) -> None:
        try:
            async with asyncio.timeout(self._settings.worker_stop_timeout_s):
                await self._scale(state, -1)
        except (KubeApiError, TimeoutError) as exc:
            logger.warning("pool %s: taking back a failed start: %s", state.spec.name, exc)

    # ---- pods ----

    def _is_leaving(self, pod_name: str) -> bool:
        pod = self._pods.get(pod_name)
        return pod is None or pod.is_gone

    async def _refresh(self) -> None:
        """List every pool's pods once; lose workers whose pods went, adopt new ready ones.

        Serialised: an older listing applied after a newer one would lose and re-adopt pods.
        """
        async with self._refresh_lock:
            await self._refresh_once()

    async def _refresh_once(self) -> None:
        doc = await self._api.list_pods(pool_selector())
        pods = read_pods(doc, default_port=self._knative.container_port)
        self._pods = {p.name: p for p in pods}
        for worker in list(self._workers.values()):
            if worker.is_stopping:
                continue
            pod = self._pods.get(worker.pod)
            if pod is None:
                self._lose(worker, "its pod is gone")
            elif pod.is_gone:
                self._lose(
                    worker, f"its pod is {'terminating' if pod.is_terminating else pod.phase}"
                )
            elif pod.worker_id != worker.record.id:
                self._lose(worker, "its runtime container restarted")
        self._condemned &= {p.worker_id for p in pods}
        for pod in sorted(pods, key=lambda p: (p.started_at, p.name)):
            state = self._pools.get(pod.pool)
            if state is None or pod.is_gone or not pod.is_ready or not pod.ip:
                continue
            if pod.worker_id in self._workers or pod.worker_id in self._condemned:
                continue
            self._adopt(state, pod)
        event, self._refreshed = self._refreshed, asyncio.Event()
        event.set()

    def _adopt(self, state: _Pool, pod: PodView) -> None:
        record = WorkerRecord(
            id=pod.worker_id,
            url=pod.url,
            pool=state.spec.name,
            device=state.spec.device,
            memory_bytes=state.spec.memory_bytes,
            state=WorkerState.READY,
            started_at=pod.started_at or self._wall(),
            grpc_address=pod.grpc_address,
        )
        self._workers[record.id] = _Worker(record=record, pod=pod.name)
        while state.waiters:
            waiter = state.waiters.popleft()
            if not waiter.done():
                waiter.set_result(record)
                return
        logger.info(
            "worker %s (pod on %s) adopted at %s",
            record.id,
            pod.node,
            record.url,
            extra={"worker": record.id},
        )

    def _lose(self, worker: _Worker, reason: str) -> None:
        worker_id = worker.record.id
        self._workers.pop(worker_id, None)
        logger.warning("worker %s lost: %s", worker_id, reason, extra={"worker": worker_id})
        self._spawn(self._report_lost(worker_id), f"lost-{worker_id}")

    async def _report_lost(self, worker_id: str) -> None:
        try:
            await self._on_worker_lost(worker_id)
        except Exception:
            logger.exception("handling the loss of worker %s failed", worker_id)

    def _why_not_started(self, state: _Pool, timeout_s: float) -> str:
        pending = [
            p
            for p in self._pods.values()
            if p.pool == state.spec.name and not p.is_ready and not p.is_gone
        ]
        reason = f"no new pod of {state.service} became ready within {timeout_s:g} s"
        problems = sorted({p.problem for p in pending if p.problem})
        if problems:
            reason += " (" + "; ".join(problems) + ")"
        elif pending:
            reason += f" ({len(pending)} pod(s) still starting)"
        return reason

    async def _wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Whether ``condition`` held after some pod listing within ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                while not condition():
                    event = self._refreshed
                    self._wake.set()
                    await event.wait()
        except TimeoutError:
            return condition()
        return True

    async def _poll_loop(self) -> None:
        interval = self._knative.pod_poll_interval_s
        while True:
            # Cleared before the listing: a wake-up asked for during it gets another one.
            self._wake.clear()
            try:
                await self._refresh()
            except KubeApiError as exc:
                logger.warning("listing runtime pods: %s", exc.message)
            except Exception:
                # The loop is what notices lost workers: it must outlive a bad answer.
                logger.exception("listing runtime pods failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.worker_health_interval_s)
            failing = await probe_round(
                list(self._workers.values()),
                self.health,
                self._settings.worker_health_failures,
            )
            for worker in failing:
                # The probes took a while: the worker may have gone or begun stopping.
                if self._workers.get(worker.record.id) is worker and not worker.is_stopping:
                    self._condemned.add(worker.record.id)
                    self._lose(worker, f"{worker.failures} failed liveness probes")
                    self._spawn(self._delete_pod(worker.pod), f"delete-{worker.pod}")

    async def _delete_pod(self, pod: str) -> None:
        try:
            # The ReplicaSet replaces it (min-scale is unchanged): a fresh, empty worker.
            await self._api.delete_pod(
                pod, grace_period_s=int(self._settings.worker_stop_timeout_s)
            )
        except KubeApiError as exc:
            logger.warning("deleting unresponsive pod %s: %s", pod, exc.message)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
