"""How many threads an ONNX Runtime session gets, and whether they spin: a pure decision.

The CPU provider runs each operator on an intra-op pool: the thread calling ``run`` plus
``intra_op_num_threads - 1`` workers. Handing a parallel section to a worker costs a wake-up
(a futex, and on a VM an inter-processor interrupt when the other vCPU is idle) unless the
worker spins, and spinning burns a core the server's event loop needs. Measured on the
2-core VM with the light MLP (9.6 MB, issue 19):

* a batch-1 run takes the same ~130 us on one thread as on a pool of two, and a batch of 8
  the same ~370 us, because such a GEMV is too short to share; the pool only adds CPU
  (154 against 165-322 us of CPU per batch-1 call, the most with spinning on);
* served, a pool that sleeps loses at c=1 (its worker is woken three or four times per
  request), one that spins loses at c=64 (it takes the event loop's core), and one thread
  with no pool loses at neither: no wake-ups, no spinning, one core left to the loop;
* for a large model (168 MB heavy MLP) the engine is the bottleneck and a spinning pool
  serves 1,300-1,450 infer/s against 1,000 with a sleeping one.

So a small model gets one thread and no pool; a large one shares the machine's cores among
its instances (each instance runs a batch at once on its own executor thread, and all of
them share one pool), spinning when it has a pool to keep awake. Batch size does not enter:
the session's threads are fixed when it is created while batches vary call by call, and
the batches a small model sees (up to its ``max_batch_size`` of rows) gained nothing from a
second thread here. The model configuration's ``parameters`` override each choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

SMALL_MODEL_MAX_BYTES: Final = 32 * 2**20
"""Weights (the version folder's files) below which a model runs on one thread, no pool."""


@dataclass(frozen=True)
class ThreadPolicy:
    """What a session is opened with."""

    intra_op_threads: int
    """``intra_op_num_threads``: 1 runs every operator on the calling thread."""
    is_spinning: bool
    """Whether idle pool threads spin (``session.*.allow_spinning``)."""


def choose_threads(*, weight_bytes: int, instances: int, cores: int) -> ThreadPolicy:
    """The policy for a model of ``weight_bytes`` served by ``instances`` executions at once
    on a machine of ``cores`` usable cores (see the module docstring)."""
    if weight_bytes < SMALL_MODEL_MAX_BYTES:
        return ThreadPolicy(intra_op_threads=1, is_spinning=False)
    threads = max(1, cores // max(1, instances))
    return ThreadPolicy(intra_op_threads=threads, is_spinning=threads > 1)
