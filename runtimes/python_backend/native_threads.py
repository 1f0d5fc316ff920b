"""A stub's native helper threads run at idle CPU priority.

Libraries a model calls start thread pools of their own, outside Python (ONNX Runtime's
intra-op pool, OpenMP's, BLAS's), and by default those threads spin between runs waiting
for the next one. In a stub they compete for the CPU with the server that feeds the model:
with one ONNX Runtime session of default options on two cores, the pool's second thread
spun 95% of a core under load and the server, left the rest, answered fewer requests than
the model could run (python -m bench.python_backend; README). At idle priority
(``SCHED_IDLE``) such a thread gets a core only when nothing else wants it, so a busy
server keeps its share and an idle one leaves the pool all it can use.

Only threads Python does not know are lowered: the stub's main thread (which runs
``execute``) and every ``threading`` thread the model starts (a decoupled model's senders,
an async model's event loop) keep their priority. Pools appear when a library first needs
them, at ``initialize`` or at the first run, so the stub looks after ``initialize`` and
after its first executions, then seldom (:func:`is_time_to_look`). The model parameter
``native_threads: "normal"`` leaves every thread as the library made it.

Standard library only, Linux only (elsewhere nothing is lowered).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Set
from pathlib import Path
from typing import Final

PARAMETER: Final = "native_threads"
"""The model configuration parameter: ``idle`` (the default) or ``normal``."""
CHOICES: Final = ("idle", "normal")
FIRST_LOOKS: Final = 8
"""Executions after each of which the stub looks for new threads."""
LOOK_EVERY: Final = 1024
"""After those, it looks once per this many executions."""
_TASKS: Final = Path("/proc/self/task")


def to_lower(tasks: Iterable[int], python_threads: Set[int], lowered: Set[int]) -> list[int]:
    """The thread ids among ``tasks`` to put at idle priority: those Python does not know,
    not lowered before, in order."""
    return sorted(t for t in set(tasks) if t not in python_threads and t not in lowered)


def is_time_to_look(executions: int) -> bool:
    """Whether to look for new native threads after ``executions`` executions."""
    return executions <= FIRST_LOOKS or executions % LOOK_EVERY == 0


class NativeThreads:
    """Lowers the process's native threads as they appear (no-op when ``enabled`` is
    False or the system cannot say which threads the process has)."""

    def __init__(self, *, enabled: bool) -> None:
        self._is_enabled = enabled and hasattr(os, "sched_setscheduler") and _TASKS.is_dir()
        self._lowered: set[int] = set()

    def look(self) -> None:
        """Put every native thread not yet lowered at idle priority."""
        if not self._is_enabled:
            return
        try:
            tasks = [int(name) for name in os.listdir(_TASKS)]
        except OSError:
            return
        python_threads = {t.native_id for t in threading.enumerate() if t.native_id is not None}
        # Threads that ended leave the set, so that a reused id is looked at again.
        self._lowered &= set(tasks)
        for tid in to_lower(tasks, python_threads, self._lowered):
            # A thread may end meanwhile; lowering a thread of one's own needs no privilege.
            with contextlib.suppress(OSError):
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                self._lowered.add(tid)
