"""The worker template as the local backend sees it: a ``python -m data_plane.template``
process, started with the backend, that has imported the data plane and forks each worker
on request, so that a worker starts without an interpreter's start and imports.

The template is a child of this process in a session of its own, on a Unix socket pair
(`foundation.worker_template` is the wire). It dies with this process (``PR_SET_PDEATHSIG``,
as workers do) and its workers die with it. A forked worker is a child of the template, not
of this process: `ForkedProcess` stands for it where the backend keeps an
``asyncio.subprocess.Process``, its exit status being the one the template reports after
reaping it. When the template is gone, every worker it forked is reported exited (the
kernel kills them), and `fork` raises `TemplateUnavailableError`: the backend then spawns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from control_plane.errors import ControlPlaneUnavailableError
from foundation.worker_template import (
    MAX_LINE_BYTES,
    Exited,
    Forked,
    ForkRequest,
    Ready,
    Refused,
    decode,
    encode,
)

__all__ = ["ForkedProcess", "TemplateUnavailableError", "WorkerTemplate"]

logger = logging.getLogger(__name__)

_CLOSE_TIMEOUT_S: Final = 5.0


class TemplateUnavailableError(ControlPlaneUnavailableError):
    """The worker template cannot fork a worker now (it did not start, died, or refused);
    the local backend spawns the worker instead, so this never reaches a client."""

    def __init__(self, *, reason: str) -> None:
        super().__init__(f"the worker template is unavailable: {reason}")
        self.reason = reason


class ForkedProcess:
    """A worker the template forked: ``pid`` (the leader of its own process group), and
    ``returncode`` once the template has reaped it (None while it runs)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._exited = asyncio.Event()

    async def wait(self) -> int:
        """Its exit status, once it has exited (negative: the signal that ended it)."""
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def set_exited(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
            self._exited.set()


class WorkerTemplate:
    """One template process; `start` it, `fork` workers from it, `close` it.

    Parameters:
        python: the interpreter the template runs on.
        env: its environment, which every worker it forks inherits.
        preload: modules it imports beyond the data plane's (``torch`` for a GPU pool).
        preexec: run in the template's process before exec (the die-with-parent hook).
        request_timeout_s: how long a fork may take to be answered.
    """

    def __init__(
        self,
        python: str,
        env: Mapping[str, str],
        *,
        preload: Sequence[str] = (),
        preexec: Callable[[], None] | None = None,
        request_timeout_s: float = 10.0,
    ) -> None:
        self._python = python
        self._env = dict(env)
        self._preload = tuple(preload)
        self._preexec = preexec
        self._request_timeout_s = request_timeout_s
        self._process: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[Ready] | None = None
        self._pending: dict[int, asyncio.Future[ForkedProcess]] = {}
        self._workers: dict[int, ForkedProcess] = {}
        self._next_id = 0
        self._failure: str | None = None

    @property
    def pid(self) -> int | None:
        """The template's process id, once started."""
        return self._process.pid if self._process is not None else None

    @property
    def is_usable(self) -> bool:
        """Not failed, died or closed (it may still be starting)."""
        return self._failure is None

    async def start(self, timeout_s: float) -> Ready:
        """Start the template and wait until it has imported what it preloads;
        `TemplateUnavailableError` when it does not get there within ``timeout_s``."""
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_future()
            await self._launch()
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(self._ready)
        except TimeoutError:
            self._fail(f"not ready within {timeout_s:g} s")
            await self._stop_process(at_once=True)
            raise TemplateUnavailableError(reason=self._failure or "not ready") from None

    async def fork(
        self, worker_id: str, settings: Mapping[str, Any], log_path: Path | None
    ) -> ForkedProcess:
        """A new worker running the data plane with ``settings`` (`DataPlaneSettings` fields
        as JSON), its output appended to ``log_path`` (None: the template's own streams)."""
        if self._ready is None or self._writer is None:
            raise TemplateUnavailableError(reason="not started")
        if self._failure is not None:
            raise TemplateUnavailableError(reason=self._failure)
        await asyncio.shield(self._ready)
        self._next_id += 1
        request = ForkRequest(
            id=self._next_id,
            worker_id=worker_id,
            settings=dict(settings),
            log_path=str(log_path) if log_path is not None else None,
        )
        answer: asyncio.Future[ForkedProcess] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = answer
        try:
            self._writer.write(encode(request))
            await self._writer.drain()
            async with asyncio.timeout(self._request_timeout_s):
                return await answer
        except (OSError, TimeoutError) as exc:
            reason = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
            raise TemplateUnavailableError(reason=reason) from None
        finally:
            # A late answer finds no request and kills its worker (see _on_forked).
            self._pending.pop(request.id, None)

    async def close(self) -> None:
        """Hang up and wait for the template to exit (its workers die with it)."""
        self._fail("closed")
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        await self._stop_process()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        self._gone()

    # ---- the template's side ----

    async def _launch(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [self._python, "-m", "data_plane.template", "--fd", str(theirs.fileno())]
        for module in self._preload:
            argv += ["--preload", module]
        try:
            self._process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                env=self._env,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                preexec_fn=self._preexec,
            )
        except OSError as exc:
            ours.close()
            self._fail(f"could not start: {exc}")
            assert self._ready is not None
            self._ready.set_exception(TemplateUnavailableError(reason=self._failure or ""))
            self._ready.exception()  # retrieved here: nobody may be waiting yet
            return
        finally:
            theirs.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=ours, limit=MAX_LINE_BYTES)
        self._reader_task = asyncio.create_task(self._read(reader), name="worker-template")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                self._dispatch(decode(line))
            reason = "it exited"
        except (OSError, ValueError) as exc:
            reason = f"its socket failed: {exc}"
        self._fail(reason)
        self._gone()

    def _dispatch(self, message: object) -> None:
        if isinstance(message, Ready):
            logger.info(
                "worker template %d ready (imports %.3f s, %d thread)",
                message.pid,
                message.imports_s,
                message.threads,
            )
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(message)
        elif isinstance(message, Forked):
            self._on_forked(message)
        elif isinstance(message, Refused):
            answer = self._pending.get(message.id)
            if answer is not None and not answer.done():
                answer.set_exception(TemplateUnavailableError(reason=message.reason))
        elif isinstance(message, Exited):
            worker = self._workers.pop(message.pid, None)
            if worker is not None:
                worker.set_exited(message.returncode)

    def _on_forked(self, message: Forked) -> None:
        worker = self._workers[message.pid] = ForkedProcess(message.pid)
        answer = self._pending.get(message.id)
        if answer is None or answer.done():
            # Its requester gave up (timeout, cancellation): nobody will ever stop it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(message.pid, signal.SIGKILL)
            return
        answer.set_result(worker)

    def _fail(self, reason: str) -> None:
        """The template can fork no more: fail what waits on it."""
        if self._failure is None:
            self._failure = reason
            if reason != "closed":
                logger.warning("worker template unavailable: %s; workers will be spawned", reason)
        error = TemplateUnavailableError(reason=self._failure)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()
        for answer in self._pending.values():
            if not answer.done():
                answer.set_exception(error)

    def _gone(self) -> None:
        """The template has hung up: its workers are reported exited (they die with it,
        their death signal being the template's exit)."""
        for worker in self._workers.values():
            worker.set_exited(-signal.SIGKILL)
        self._workers.clear()

    async def _stop_process(self, *, at_once: bool = False) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        if at_once:
            process.kill()
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await process.wait()
                return
        except TimeoutError:
            pass
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
