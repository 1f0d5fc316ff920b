"""The operating-system side of the local backend's workers: free loopback ports, the
die-with-parent hook for spawned processes, signalling a worker's process group, and what
the backend needs of a worker's process (spawned or forked)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Protocol

__all__ = ["WorkerProcess", "die_with_parent_hook", "free_port", "free_ports", "signal_group"]

_PR_SET_PDEATHSIG = 1


class WorkerProcess(Protocol):
    """A worker's process as the backend watches it: a spawned child
    (``asyncio.subprocess.Process``) or a forked one (`template.ForkedProcess`)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the worker binds it a moment later; the local backend
    tries again with other ports when one was taken meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports nobody listens on now (held together while picked)."""
    with contextlib.ExitStack() as stack:
        socks = [
            stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            for _ in range(count)
        ]
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive SIGKILL when the parent dies (Linux).

    libc is looked up here, in the parent, so that the child runs no imports between fork
    and exec. The hook also closes the race where the parent died before ``prctl`` ran.
    """
    if not sys.platform.startswith("linux"):
        return None
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    libc = ctypes.CDLL(libc_name, use_errno=True)
    parent_pid = os.getpid()

    def hook() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)

    return hook


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group ``pid`` leads; nothing when it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
