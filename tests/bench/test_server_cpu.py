"""``bench.server.process_tree_cpu_seconds``: a process's CPU with its live descendants'."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.server import children_by_parent, process_cpu_seconds, process_tree_cpu_seconds

_BURN = (
    "import sys, time\n"
    "start = time.process_time()\n"
    "while time.process_time() - start < 0.3: pass\n"
    "print('burnt', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_a_busy_child_counts_in_the_tree_and_not_alone() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == "burnt\n"
            own = process_cpu_seconds(os.getpid())
            tree = process_tree_cpu_seconds(os.getpid())
            # Clock ticks are 10 ms; the child burnt 300 ms the parent alone never sees.
            assert tree - own >= 0.25
            assert process_tree_cpu_seconds(child.pid) >= 0.25
            assert child.pid in children_by_parent()[os.getpid()]
        finally:
            child.kill()
