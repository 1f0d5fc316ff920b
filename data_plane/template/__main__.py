"""``python -m data_plane.template --fd N``: the worker template the local backend starts,
serving fork requests on the inherited Unix socket ``N``."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import socket
import sys
import threading
import time

from data_plane.template.preload import count_gpus, load_libc, preload


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="zeroserve's worker template")
    parser.add_argument("--fd", type=int, required=True, help="the socket to the local backend")
    parser.add_argument(
        "--preload", action="append", default=[], metavar="MODULE", help="also import MODULE"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    preload(args.preload)
    imports_s = time.perf_counter() - started
    # What the imports made lives as long as any worker: out of the collector's reach, a
    # worker's collections neither walk it (a full one took 0.23 s here) nor write to its
    # pages, which would copy them from the template one by one.
    gc.collect()
    gc.freeze()
    from data_plane.template.child import LOG_FORMAT, Inherited
    from data_plane.template.server import ForkServer
    from foundation.worker_template import Ready

    # The template shares the platform's standard error: only its problems go there (each
    # worker logs at INFO into its own log, as `child` sets up).
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    inherited = Inherited(template_pid=os.getpid(), libc=load_libc(), gpu_count=count_gpus())
    ready = Ready(pid=os.getpid(), threads=threading.active_count(), imports_s=imports_s)
    with socket.socket(fileno=args.fd) as sock:
        return ForkServer(sock, inherited).serve(ready)


if __name__ == "__main__":
    sys.exit(main())
