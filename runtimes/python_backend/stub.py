"""The stub process: ``python -m runtimes.python_backend.stub`` runs one model instance.

The server starts it (a fresh interpreter, never a fork of the server) with the control
socket and the two arenas as inherited file descriptors. The stub says ``hello`` before
it imports anything beyond the standard library, so that an environment without numpy
(``EXECUTION_ENV_PATH``) gets a load error naming the problem instead of a silent exit;
then it serves messages (:class:`~runtimes.python_backend.model_host.ModelHost`) until
the server says ``finalize``, closes the channel, or dies.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence

from runtimes.python_backend import messages
from runtimes.python_backend.arena import Arena


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m runtimes.python_backend.stub")
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--input-fd", type=int, required=True)
    parser.add_argument("--output-fd", type=int, required=True)
    parser.add_argument("--output-limit-bytes", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--name", required=True)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    sock = socket.socket(fileno=args.socket_fd)
    messages.send(sock, {"kind": "hello", "pid": os.getpid(), "python": sys.version})
    try:
        from runtimes.python_backend.model_host import ModelHost, watch_parent
    except Exception as exc:
        _refuse(sock, f"the model's Python ({sys.executable}) cannot run the stub: {exc!r}")
        return 1
    watch_parent(args.parent_pid)
    inputs = Arena(args.input_fd, limit_bytes=0)
    outputs = Arena(args.output_fd, limit_bytes=args.output_limit_bytes)
    return ModelHost(sock, inputs, outputs, args.name).serve()


def _refuse(sock: socket.socket, reason: str) -> None:
    """Answer the first request with ``reason`` (the server is waiting for one answer)."""
    try:
        request = messages.receive(sock)
    except (messages.ChannelClosedError, OSError):
        return
    answers = {"init": "init_done", "auto_complete": "auto_complete_done"}
    kind = answers.get(request["kind"])
    if kind is not None:
        messages.send(sock, {"kind": kind, "error": reason})


if __name__ == "__main__":
    sys.exit(main())
