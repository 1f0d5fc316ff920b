"""The template's loop: read fork requests from the local backend's socket, fork a worker
for each, and report each worker's exit once reaped.

One thread, no event loop: a plain ``poll`` over the control socket and one pidfd per live
worker (readable when it exits), so that nothing that ``fork`` cannot copy ever exists
here. The loop ends when the backend closes the socket (the platform stopped or died); the
workers, whose death signal is the template's exit, then die with it.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import sys
import threading

from data_plane.template.child import Inherited, become_worker
from foundation.worker_template import (
    MAX_LINE_BYTES,
    Exited,
    Forked,
    ForkRequest,
    Ready,
    Refused,
    TemplateMessage,
    decode,
    encode,
)

__all__ = ["ForkServer"]

logger = logging.getLogger(__name__)

_READ_BYTES = 65536


class ForkServer:
    """Forks workers on request over ``sock`` (a connected Unix stream socket)."""

    def __init__(self, sock: socket.socket, inherited: Inherited) -> None:
        self._sock = sock
        self._inherited = inherited
        self._poller = select.poll()
        self._pidfds: dict[int, int] = {}
        """pidfd -> pid of each worker not yet reaped."""
        self._buffer = b""

    def serve(self, ready: Ready) -> int:
        """Announce ``ready`` and serve until the backend hangs up; the exit status."""
        try:
            self._send(ready)
            self._poller.register(self._sock.fileno(), select.POLLIN)
            while True:
                for fd, _ in self._poller.poll():
                    if fd != self._sock.fileno():
                        self._reap(fd)
                    elif not self._read():
                        return 0
        except (BrokenPipeError, ConnectionResetError):
            return 0

    def _read(self) -> bool:
        """Handle what the backend sent; False once it hung up."""
        data = self._sock.recv(_READ_BYTES)
        if not data:
            return False
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self._handle(line)
        if len(self._buffer) > MAX_LINE_BYTES:
            logger.error("worker template: a request over %d bytes; hanging up", MAX_LINE_BYTES)
            return False
        return True

    def _handle(self, line: bytes) -> None:
        try:
            message = decode(line)
        except ValueError as exc:
            logger.error("worker template: %s", exc)
            return
        if not isinstance(message, ForkRequest):
            logger.error("worker template: unexpected %s", type(message).__name__)
            return
        self._send(self._fork(message))

    def _fork(self, request: ForkRequest) -> Forked | Refused:
        threads = threading.active_count()
        if threads != 1:
            # A thread would be missing from the child, with whatever locks it held.
            return Refused(request.id, f"the template runs {threads} threads; it forks with 1")
        # Anything buffered would be written twice, by the template and by the child.
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            return Refused(request.id, f"fork failed: {exc}")
        if pid == 0:
            become_worker(request, self._inherited, [self._sock.fileno(), *self._pidfds])
        pidfd = os.pidfd_open(pid)
        self._pidfds[pidfd] = pid
        self._poller.register(pidfd, select.POLLIN)
        return Forked(request.id, pid)

    def _reap(self, pidfd: int) -> None:
        pid = self._pidfds.pop(pidfd)
        self._poller.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        self._send(Exited(pid, os.waitstatus_to_exitcode(status)))

    def _send(self, message: TemplateMessage) -> None:
        self._sock.sendall(encode(message))
