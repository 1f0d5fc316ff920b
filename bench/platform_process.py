"""The platform under test: ``zeroserve up`` as a subprocess, driven through its admin API.

:class:`PlatformProcess` runs ``python -m zeroserve.cli up`` (control plane, activator and
local workers in one process tree) on free loopback ports, through
:class:`bench.server.ServerProcess`, which waits for the activator's readiness and stops the
process however the block is left. Start-up also waits for the control plane to act (hold
its lease). On exit, after the platform has stopped its workers, any of its worker processes
still alive is killed by pid, so that no benchmark leaves a worker behind. The admin calls
use ``bench.server.request`` (``http.client``): none of them is on a timed path that a few
hundred microseconds would matter to.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from bench.server import ServerProcess, children_by_parent, free_port, request

_POLL_S: Final = 0.05
_WAIT_TIMEOUT_S: Final = 120.0

FAST_RESET_ENV: Final = {
    "ZEROSERVE_CONTROL_PLANE_POOL_GRACE_PERIOD_S": "0.5",
    "ZEROSERVE_CONTROL_PLANE_PLACEMENT_PROPAGATION_S": "0.2",
}
"""Settings that only shorten the way back to zero between runs (how long surplus empty
workers live, the pause between removing a placement and unloading); neither is on the path
of a request. The reaper's interval stays at its default: it decides when a replacement warm
worker starts, which can overlap a cold start."""


class PlatformProcess:
    """``zeroserve up`` on free ports, with its admin API; stops everything on exit.

    Parameters:
        workdir: where the platform's log and its workers' logs go.
        cache_dir: the node cache folder (``--cache-dir``).
        allowed_storage: storage roots models may be registered from.
        max_workers, warm_workers: the pool's bounds (``--max-workers``, ``--warm-workers``).
        env: more environment for the platform and its workers (``AWS_*``, settings).
        name: names the log files.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        cache_dir: Path,
        allowed_storage: tuple[str, ...],
        max_workers: int = 1,
        warm_workers: int = 0,
        env: Mapping[str, str] | None = None,
        name: str = "platform",
    ) -> None:
        self.port = free_port()
        self.admin_port = free_port()
        self._token = secrets.token_urlsafe(18)
        self.worker_log_dir = workdir / f"{name}-workers"
        environment = {
            "PYTHONUNBUFFERED": "1",
            "ZEROSERVE_ADMIN_TOKEN": self._token,
            "ZEROSERVE_ALLOWED_STORAGE": ",".join(allowed_storage),
            "ZEROSERVE_CONTROL_PLANE_WORKER_LOG_DIR": str(self.worker_log_dir),
            # The default SQLite state, kept in the run's folder, not the user's data folder.
            "XDG_DATA_HOME": str(workdir / f"{name}-data"),
            # Benchmarks measure serving without keys unless they say otherwise (``env``);
            # bench/activator.py measures both.
            "ZEROSERVE_ACTIVATOR_AUTH": "off",
            **(env or {}),
        }
        arguments = ["up", "--port", str(self.port), "--admin-port", str(self.admin_port)]
        arguments += ["--cache-dir", str(cache_dir), "--max-workers", str(max_workers)]
        arguments += ["--warm-workers", str(warm_workers), "--log-level", "warning"]
        # `env` execs the interpreter, so the pid ServerProcess sees is the platform's.
        command = ["env", *(f"{k}={v}" for k, v in environment.items())]
        command += [sys.executable, "-m", "zeroserve.cli", *arguments]
        self._server = ServerProcess(command, self.port, workdir / f"{name}.log")
        self.command = [self._token_hidden(part) for part in command]
        """The command line, token masked, for the results."""
        self._worker_pids: set[int] = set()

    @property
    def pid(self) -> int:
        return self._server.pid

    def __enter__(self) -> Self:
        self._server.__enter__()
        try:
            self.wait_until(lambda: bool(self._healthz()["acting"]), "the control plane to act")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> int | None:
        """Stop the platform (it stops its workers), then kill any worker left; exit status."""
        with contextlib.suppress(OSError):
            self._worker_pids |= _children(self.pid)
        status = self._server.stop()
        deadline = time.monotonic() + 10.0
        alive = {pid for pid in self._worker_pids if is_alive(pid)}
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = {pid for pid in alive if is_alive(pid)}
        for pid in alive:
            print(f"killing worker {pid}, left behind by the platform", file=sys.stderr)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return status

    def worker_pids(self) -> set[int]:
        """The platform's live child processes: its workers, starting ones included (the
        admin API lists a worker only once it answers)."""
        pids = {pid for pid in _children(self.pid) if is_alive(pid)}
        self._worker_pids |= pids
        return pids

    def log_tail(self, lines: int = 40) -> str:
        return self._server.log_tail(lines)

    def cpu_seconds(self) -> float:
        """CPU the platform process (control plane and activator) has used so far."""
        return self._server.cpu_seconds()

    # ---- admin API ----

    def admin(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        expect: tuple[int, ...] = (200,),
        timeout_s: float = 300.0,
    ) -> Any:
        """One admin call (``path`` under ``/admin/v1``); the decoded JSON answer."""
        headers = {"Authorization": f"Bearer {self._token}"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        status, _, answer = request(
            self.admin_port,
            method,
            f"/admin/v1{path}",
            body=payload,
            headers=headers,
            timeout_s=timeout_s,
        )
        if status not in expect:
            raise RuntimeError(f"{method} /admin/v1{path} answered {status}: {answer[:500]!r}")
        return json.loads(answer) if answer else None

    def register(self, name: str, storage_uri: str, scaling: dict[str, Any]) -> Any:
        body = {"name": name, "storage_uri": storage_uri, "scaling": scaling}
        return self.admin("POST", "/models", body, expect=(201,))

    def model(self, name: str) -> Any:
        return self.admin("GET", f"/models/{name}")

    def load(self, name: str) -> Any:
        """Bring ``name`` up; returns once it is ready."""
        return self.admin("POST", f"/models/{name}/load")

    def unload(self, name: str) -> Any:
        """Take every replica of ``name`` away; returns once the workers have unloaded it."""
        return self.admin("POST", f"/models/{name}/unload")

    def activations(self, name: str) -> list[dict[str, Any]]:
        """The newest cold-start timelines of ``name``, newest first."""
        timelines: list[dict[str, Any]] = self.admin("GET", f"/models/{name}/activations")[
            "activations"
        ]
        return timelines

    def workers(self) -> list[dict[str, Any]]:
        """The pool's workers (their pids are remembered, to be sure they end)."""
        workers: list[dict[str, Any]] = self.admin("GET", "/workers")["workers"]
        for worker in workers:
            pid = worker.get("details", {}).get("pid")
            if isinstance(pid, int):
                self._worker_pids.add(pid)
        return workers

    def wait_until(
        self, check: Callable[[], bool], what: str, timeout_s: float = _WAIT_TIMEOUT_S
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(_POLL_S)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.log_tail()}")

    def _healthz(self) -> dict[str, Any]:
        status, _, answer = request(self.admin_port, "GET", "/healthz", timeout_s=5.0)
        if status != 200:
            return {"acting": False}
        document: dict[str, Any] = json.loads(answer)
        return document

    def _token_hidden(self, text: str) -> str:
        return text.replace(self._token, "<token>")


def is_alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return text.rsplit(")", 1)[1].split()[0] != "Z"


def _children(pid: int) -> set[int]:
    return set(children_by_parent().get(pid, ()))
