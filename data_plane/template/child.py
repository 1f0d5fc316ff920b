"""What a worker forked from the template does before it serves, and its serving.

The child starts as a copy of the template: the template's session, signal dispositions,
standard streams, logging handlers and control socket. It makes itself what a worker
started by ``python -m data_plane`` would be: a session of its own (the local backend
signals the worker's process group), killed when the template dies (which dies with the
platform, so no orphan outlives it), default signal dispositions, stdin from /dev/null and
stdout/stderr to its log, logging set up afresh on those streams, and numpy's global
random state reseeded (``random``'s is, by Python, at fork). Then it runs the data plane
and leaves with ``os._exit``: it must never return into the template's loop.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, NoReturn

import numpy as np

from data_plane.server import run
from data_plane.settings import DataPlaneSettings
from data_plane.storage import StorageError
from foundation.serving import ServerStartError
from foundation.worker_template import ForkRequest

__all__ = ["Inherited", "become_worker"]

LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The layout ``zeroserve serve`` logs in, which tools read workers' logs by."""

_PR_SET_PDEATHSIG: Final = 1
# Exit statuses as ``zeroserve serve`` gives them.
_STORAGE_FAILURE: Final = 2
_START_FAILURE: Final = 3


@dataclass(frozen=True)
class Inherited:
    """What the template found out once for all its children."""

    template_pid: int
    libc: ctypes.CDLL | None
    """Loaded before the fork, so that the child runs no lookup before ``prctl``."""
    gpu_count: int | None
    """GPUs, counted once in a throwaway process (`preload.count_gpus`); None where it
    could not tell, and the worker counts for itself."""
    log_level: int = logging.INFO


def become_worker(request: ForkRequest, inherited: Inherited, close_fds: Iterable[int]) -> NoReturn:
    """Turn this freshly forked child into the worker ``request`` asks for; never returns."""
    code = 1
    try:
        _detach(inherited)
        for fd in close_fds:
            os.close(fd)
        _reset_signals()
        _redirect_streams(request.log_path)
        _reset_logging(inherited.log_level)
        np.random.seed()
        code = _serve(request, inherited)
    except BaseException:  # whatever happens, the child must exit here, not return
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _detach(inherited: Inherited) -> None:
    os.setsid()
    if inherited.libc is not None:
        inherited.libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The template may have died between the fork and prctl: then nobody would kill us.
    if os.getppid() != inherited.template_pid:
        os._exit(1)


def _reset_signals() -> None:
    """The dispositions a new interpreter starts with (the data plane installs its own)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _redirect_streams(log_path: str | None) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if log_path is None:
        return
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def _reset_logging(level: int) -> None:
    # The template's handlers hold its streams and locks; the worker's write to the (now
    # redirected) standard error like a spawned worker's.
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr, force=True)


def _serve(request: ForkRequest, inherited: Inherited) -> int:
    settings = DataPlaneSettings(**request.settings)
    if settings.gpu_count is None and inherited.gpu_count is not None:
        settings = settings.model_copy(update={"gpu_count": inherited.gpu_count})
    logging.getLogger(__name__).info(
        "worker %s forked from template %d", request.worker_id, inherited.template_pid
    )
    try:
        run(settings)
    except StorageError as exc:
        print(f"zeroserve worker: {exc.message}", file=sys.stderr)
        return _STORAGE_FAILURE
    except ServerStartError as exc:
        print(f"zeroserve worker: {exc.message}", file=sys.stderr)
        return _START_FAILURE
    except OSError as exc:  # its port was taken between the backend's pick and the bind
        print(f"zeroserve worker: {exc}", file=sys.stderr)
        return 1
    return 0
