"""The local backend: workers are ``python -m data_plane`` child processes on loopback ports,
each with a port for HTTP and one for gRPC (its record's ``url`` and ``grpc_address``).

Each worker runs in explicit model-control mode over an empty model repository, shares the
node cache folder with its siblings, and lives in its own session (so a Ctrl-C at the terminal
reaches only the platform, which then stops workers in order). On Linux a worker also gets
``PR_SET_PDEATHSIG``: if the platform dies without stopping it (SIGKILL, crash), the kernel
kills it, so no orphan survives any way the parent goes.

A worker whose process exits, or that fails ``worker_health_failures`` probes in a row, is
killed (its whole process group) and reported to the ``WorkerLost`` callback.

With ``worker_template`` on (Linux), a worker is forked from a template process started
with the backend (`template`), which has imported the data plane already; the worker then
is the template's child, and the template reports its exit. Stopping, killing and probing
work on its pid as on a spawned worker's. While the template is starting a worker waits for
it; where it failed or died, the worker is spawned instead and a new template starts in the
background (a few times at most over the backend's life).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from control_plane.backends.base import PodBackend, PoolSpec, WorkerLost
from control_plane.backends.processes import (
    WorkerProcess,
    die_with_parent_hook,
    free_port,
    free_ports,
    signal_group,
)
from control_plane.backends.template import TemplateUnavailableError, WorkerTemplate
from control_plane.errors import NoCapacityError, WorkerStartError
from control_plane.settings import ControlPlaneSettings
from control_plane.worker_client import probe_live, probe_round
from foundation.records import WorkerRecord, WorkerState

__all__ = ["LocalBackend", "free_port"]

logger = logging.getLogger(__name__)

# How often a starting worker is probed for liveness: a forked worker answers some 20 to
# 50 ms after its fork, a spawned one after a second of imports, during which each probe
# would only take CPU from it.
_FORKED_POLL_S = 0.01
_SPAWNED_POLL_S = 0.05
_PORT_ATTEMPTS = 3
_TEMPLATE_RESTARTS = 3
"""New templates started after the first failed or died, over the backend's life: one that
keeps failing costs a second of imports each time, and spawning works without it."""
FORKED = "forked"
SPAWNED = "spawned"


@dataclass
class _Worker:
    record: WorkerRecord
    process: WorkerProcess
    log_path: Path | None
    is_stopping: bool = False
    failures: int = 0
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)


class LocalBackend(PodBackend):
    """Workers as child processes of this one.

    Parameters:
        settings: worker timeouts, cache folder, log folder and storage allow-list.
        on_worker_lost: told about workers that died or stopped answering.
        repository: the ``--model-repository`` workers start with (created if missing).
        extra_env: variables set for workers on top of this process's environment.
    """

    def __init__(
        self,
        settings: ControlPlaneSettings,
        *,
        on_worker_lost: WorkerLost,
        repository: Path,
        extra_env: dict[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self._settings = settings
        self._on_worker_lost = on_worker_lost
        self._repository = repository
        self._extra_env = dict(extra_env or {})
        self._python = python
        self._pools: dict[str, PoolSpec] = {}
        self._workers: dict[str, _Worker] = {}
        self._starting: dict[str, int] = {}
        self._preexec = die_with_parent_hook()
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.worker_health_timeout_s),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )
        self._health_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._is_closed = False
        self._template: WorkerTemplate | None = None
        self._template_start: asyncio.Task[Any] | None = None
        self._template_pool: PoolSpec | None = None
        self._template_restarts = 0

    # ---- PodBackend ----

    async def ensure_pool(self, pool: PoolSpec) -> None:
        self._pools[pool.name] = pool
        if self._template is None and self._settings.worker_template:
            self._start_template(pool)
        if self._health_task is None:
            self._health_task = asyncio.create_task(
                self._health_loop(), name="local-backend-health"
            )

    async def start_worker(self, pool: str) -> WorkerRecord:
        spec = self._pools.get(pool)
        if spec is None:
            raise WorkerStartError(pool=pool, reason="unknown pool")
        if self._is_closed:
            raise WorkerStartError(pool=pool, reason="the backend is shutting down")
        count = len(self.list_workers(pool)) + self._starting.get(pool, 0)
        if count >= spec.max_workers:
            raise NoCapacityError(
                model="*", reason=f"pool '{pool}' is at its {spec.max_workers} workers"
            )
        self._starting[pool] = self._starting.get(pool, 0) + 1
        try:
            await asyncio.to_thread(self._repository.mkdir, parents=True, exist_ok=True)
            last_error = "no attempt made"
            for _ in range(_PORT_ATTEMPTS):
                worker, last_error = await self._spawn(spec)
                if worker is not None:
                    return worker.record
            raise WorkerStartError(pool=pool, reason=last_error)
        finally:
            self._starting[pool] -= 1

    async def stop_worker(self, worker_id: str) -> None:
        worker = self._workers.get(worker_id)
        if worker is None:
            return
        worker.is_stopping = True
        await self._terminate(worker)
        self._workers.pop(worker_id, None)
        logger.info(
            "worker %s stopped (exit status %s)",
            worker_id,
            worker.process.returncode,
            extra={"worker": worker_id},
        )

    async def delete_pool(self, pool: str) -> None:
        await asyncio.gather(*(self.stop_worker(w.id) for w in self.list_workers(pool)))
        self._pools.pop(pool, None)

    def list_workers(self, pool: str | None = None) -> list[WorkerRecord]:
        return [
            w.record
            for w in self._workers.values()
            if not w.is_stopping and (pool is None or w.record.pool == pool)
        ]

    async def health(self, worker_id: str) -> bool:
        worker = self._workers.get(worker_id)
        if worker is None or worker.process.returncode is not None:
            return False
        return await probe_live(self._http, worker.record.url)

    def details(self, worker_id: str) -> dict[str, object]:
        worker = self._workers.get(worker_id)
        if worker is None:
            return {}
        doc: dict[str, object] = {"pid": worker.process.pid, "start": worker.record.start_method}
        if worker.log_path is not None:
            doc["log"] = str(worker.log_path)
        return doc

    async def close(self) -> None:
        self._is_closed = True
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for worker in self._workers.values():
            worker.is_stopping = True
        await asyncio.gather(
            *(self._terminate(w) for w in list(self._workers.values())), return_exceptions=True
        )
        self._workers.clear()
        if self._template_start is not None:
            self._template_start.cancel()
            await asyncio.gather(self._template_start, return_exceptions=True)
        if self._template is not None:
            await self._template.close()
        await self._http.aclose()

    @property
    def template(self) -> WorkerTemplate | None:
        """The worker template workers are forked from; None when it is turned off."""
        return self._template

    def kill_now(self) -> None:
        """SIGKILL every worker's process group at once, without waiting (a last resort
        when a graceful stop is not possible, e.g. on a second Ctrl-C)."""
        for worker in self._workers.values():
            if worker.process.returncode is None:
                signal_group(worker.process.pid, signal.SIGKILL)

    # ---- processes ----

    def _start_template(self, pool: PoolSpec) -> None:
        if not sys.platform.startswith("linux"):
            return
        self._template_pool = pool
        # torch only where the pool's models need it: importing it costs seconds and
        # memory in every worker. Importing it does not initialise CUDA.
        preload = ("torch",) if pool.device == "cuda" else ()
        self._template = WorkerTemplate(
            self._python, self._environment(), preload=preload, preexec=self._preexec
        )
        self._template_start = asyncio.create_task(
            self._template.start(self._settings.worker_start_timeout_s),
            name="worker-template-start",
        )
        # Its failure is logged by the template and read by the next fork.
        self._template_start.add_done_callback(lambda task: task.cancelled() or task.exception())

    def _restart_template(self, dead: WorkerTemplate) -> None:
        """Start a new template in the background in place of ``dead`` (within
        `_TEMPLATE_RESTARTS`), and let the dead one's process and reader go."""
        if self._is_closed or self._template is not dead or self._template_pool is None:
            return
        if self._template_restarts >= _TEMPLATE_RESTARTS:
            return
        self._template_restarts += 1
        logger.warning(
            "starting a new worker template (%d of %d)", self._template_restarts, _TEMPLATE_RESTARTS
        )
        task = asyncio.create_task(dead.close(), name="worker-template-close")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._start_template(self._template_pool)

    def _settings_for(self, port: int, grpc_port: int) -> dict[str, object]:
        """The data plane settings `_command` gives a spawned worker, for a forked one."""
        return {
            "model_repository": str(self._repository),
            "host": "127.0.0.1",
            "http_port": port,
            "grpc_port": grpc_port,
            "metrics_port": 0,
            "model_control_mode": "explicit",
            "cache_dir": str(self._settings.cache_dir),
        }

    def _command(self, port: int, grpc_port: int) -> list[str]:
        return [
            self._python,
            "-m",
            "data_plane",
            "--model-repository",
            str(self._repository),
            "--host",
            "127.0.0.1",
            "--http-port",
            str(port),
            # A port of its own: workers on one host would all claim gRPC's default.
            "--grpc-port",
            str(grpc_port),
            # Metrics stay on the worker's HTTP port, where the platform reads them; the
            # metrics port's default (8002) would be claimed by every worker on the host.
            "--metrics-port",
            "0",
            "--model-control-mode",
            "explicit",
            "--cache-dir",
            str(self._settings.cache_dir),
        ]

    def _environment(self) -> dict[str, str]:
        # Workers inherit our environment (AWS_*, ZEROSERVE_* for the data plane) plus
        # what the platform was told on its command line.
        return {**os.environ, "PYTHONUNBUFFERED": "1", **self._extra_env}

    async def _spawn(self, spec: PoolSpec) -> tuple[_Worker | None, str]:
        """One attempt at starting a worker; (None, why) when it lost its port or failed."""
        port, grpc_port = free_ports(2)
        worker_id = f"{spec.name}-{secrets.token_hex(3)}"
        log_path = None
        if self._settings.worker_log_dir is not None:
            log_path = self._settings.worker_log_dir / f"{worker_id}.log"
        process, method = await self._launch(worker_id, port, grpc_port, log_path)
        launched = time.monotonic()
        record = WorkerRecord(
            id=worker_id,
            url=f"http://127.0.0.1:{port}",
            pool=spec.name,
            device=spec.device,
            memory_bytes=spec.memory_bytes,
            state=WorkerState.STARTING,
            started_at=time.time(),
            grpc_address=f"127.0.0.1:{grpc_port}",
            start_method=method,
        )
        worker = _Worker(record=record, process=process, log_path=log_path)
        logger.info(
            "worker %s starting (%s, pid %d, port %d)",
            worker_id,
            method,
            process.pid,
            port,
            extra={"worker": worker_id},
        )
        try:
            reason = await self._wait_live(worker)
        except BaseException:
            await self._terminate(worker)
            raise
        if reason is not None:
            await self._terminate(worker)
            return None, reason
        boot_s = round(time.monotonic() - launched, 6)
        worker.record = dataclasses.replace(record, state=WorkerState.READY, boot_s=boot_s)
        self._workers[worker_id] = worker
        worker.watcher = asyncio.create_task(self._watch(worker), name=f"watch-{worker_id}")
        logger.info("worker %s ready at %s", worker_id, record.url, extra={"worker": worker_id})
        return worker, ""

    async def _launch(
        self, worker_id: str, port: int, grpc_port: int, log_path: Path | None
    ) -> tuple[WorkerProcess, str]:
        """The worker's process, forked from the template where it can be, else spawned."""
        template = self._template
        if template is not None and self._template_start is not None:
            # A worker asked for while the template starts waits for it (bounded by the
            # start's timeout): its imports are under way already.
            await asyncio.wait([self._template_start])
        if template is not None and not template.is_usable:
            # This worker is spawned; the next ones may be forked again.
            self._restart_template(template)
        elif template is not None:
            try:
                if log_path is not None:
                    await asyncio.to_thread(log_path.parent.mkdir, parents=True, exist_ok=True)
                forked = await template.fork(
                    worker_id, self._settings_for(port, grpc_port), log_path
                )
                return forked, FORKED
            except TemplateUnavailableError as exc:
                logger.warning("worker %s: %s; spawning it", worker_id, exc.message)
        return await self._exec(self._command(port, grpc_port), log_path), SPAWNED

    async def _exec(self, argv: Sequence[str], log_path: Path | None) -> asyncio.subprocess.Process:
        if log_path is None:
            return await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                env=self._environment(),
                start_new_session=True,
                preexec_fn=self._preexec,
            )
        await asyncio.to_thread(log_path.parent.mkdir, parents=True, exist_ok=True)
        log = await asyncio.to_thread(log_path.open, "ab")
        try:
            return await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._environment(),
                start_new_session=True,
                preexec_fn=self._preexec,
            )
        finally:
            log.close()

    async def _wait_live(self, worker: _Worker) -> str | None:
        """None once the worker answers ``/v2/health/live``; else why it never will."""
        url = f"{worker.record.url}/v2/health/live"
        poll_s = _FORKED_POLL_S if worker.record.start_method == FORKED else _SPAWNED_POLL_S
        deadline = time.monotonic() + self._settings.worker_start_timeout_s
        while time.monotonic() < deadline:
            if worker.process.returncode is not None:
                return f"the worker process exited with status {worker.process.returncode}"
            try:
                response = await self._http.get(url, timeout=1.0)
                if response.status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            await asyncio.sleep(poll_s)
        return f"no answer to its liveness probe within {self._settings.worker_start_timeout_s:g} s"

    async def _terminate(self, worker: _Worker) -> None:
        """SIGTERM the worker's process group, SIGKILL it after the stop timeout; reap it."""
        if worker.watcher is not None and worker.watcher is not asyncio.current_task():
            worker.watcher.cancel()
        process = worker.process
        if process.returncode is None:
            signal_group(process.pid, signal.SIGTERM)
            try:
                async with asyncio.timeout(self._settings.worker_stop_timeout_s):
                    await process.wait()
            except TimeoutError:
                logger.warning(
                    "worker %s did not exit within %.0f s of SIGTERM; killing it",
                    worker.record.id,
                    self._settings.worker_stop_timeout_s,
                )
        # Also reaches children the worker left behind after it exited itself.
        signal_group(process.pid, signal.SIGKILL)
        if process.returncode is None:
            await process.wait()

    async def _watch(self, worker: _Worker) -> None:
        code = await worker.process.wait()
        if worker.is_stopping:
            return
        logger.warning(
            "worker %s exited unexpectedly with status %s",
            worker.record.id,
            code,
            extra={"worker": worker.record.id},
        )
        await self._lose(worker)

    async def _lose(self, worker: _Worker) -> None:
        if worker.is_stopping:
            return
        worker.is_stopping = True
        await self._terminate(worker)
        self._workers.pop(worker.record.id, None)
        try:
            await self._on_worker_lost(worker.record.id)
        except Exception:
            logger.exception("handling the loss of worker %s failed", worker.record.id)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.worker_health_interval_s)
            failing = await probe_round(
                list(self._workers.values()),
                self.health,
                self._settings.worker_health_failures,
            )
            for worker in failing:
                logger.warning(
                    "worker %s failed %d liveness probes; killing it",
                    worker.record.id,
                    worker.failures,
                    extra={"worker": worker.record.id},
                )
                task = asyncio.create_task(self._lose(worker), name=f"lose-{worker.record.id}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
