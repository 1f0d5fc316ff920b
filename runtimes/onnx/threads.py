"""How many threads an ONNX Runtime session gets, and whether they spin: pure decisions.

The CPU provider runs each operator on an intra-op pool: the thread calling ``run`` plus
``intra_op_num_threads - 1`` workers. Handing a parallel section to a worker costs a wake-up
(a futex, and on a VM an inter-processor interrupt when the other vCPU is idle) unless the
worker spins, and spinning burns a core the server's event loop needs. Measured on the
2-core VM with the light MLP (9.6 MB, issue 19), the server otherwise quiet:

* a batch-1 run takes 142 us on one thread and 74-85 us on a spinning pool of two (170 us of
  CPU), a batch of 8 374 against 250 us, of 32 1,507 against 797 us: the GEMVs do share;
* served with one instance, the spinning pool also halves the executor hand-offs (31 + 27
  against 47 + 51 us at c=1), since the other vCPU never halts; it wins while the model
  waits for requests (c=1: 2,600 against 2,100 infer/s; c=8: 6,300 against 4,900) and loses
  badly once the event loop is the bottleneck (c=64: 7,000 against 10,300), its spinning
  taking the loop's core. A pool that sleeps, or stops spinning after each run
  (``session.force_spinning_stop``), loses at c=1 and c=8 without winning c=64;
* for a large model (168 MB heavy MLP) the engine is the bottleneck and a spinning pool
  serves 1,300-1,450 infer/s against 1,000 with a sleeping one.

No one session wins at every load, so a small model with batching on a machine of several
cores opens two: its main one on one thread with no pool (what serves a loaded server) and a
wide one on every core, spinning, for while the model is latency-bound.
:func:`is_latency_bound` switches between them batch by batch on the batch's rows, the
dynamic batcher's own measure of load: a full batch means requests pile up faster than
batches drain (the loop is busy), a batch of at most a quarter of the maximum means the
model waits for work; in between the last choice holds, so that the switch does not flap
(a wide run is short, so the next batch is smaller: switching on one threshold made c=32
and c=64 alternate between the sessions and lose 15-20 %). The queue length is no signal:
under load the requests wait unread in the sockets, not in the batcher's queue.

A large model shares the machine's cores among its instances (each instance runs a batch at
once on its own executor thread, and all of them share one pool), spinning when it has a
pool to keep awake. The model configuration's ``parameters`` override each choice, and a
model whose threads are configured gets that one session.
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


def latency_threads(*, weight_bytes: int, max_batch_size: int, cores: int) -> ThreadPolicy | None:
    """The wide session a model also gets for while it is latency-bound, or None for one
    session only: large models (their pool already spans the cores), models without
    batching (every batch is one request: rows say nothing of load) and one-core machines.
    """
    if weight_bytes >= SMALL_MODEL_MAX_BYTES or max_batch_size < 1 or cores < 2:
        return None
    return ThreadPolicy(intra_op_threads=cores, is_spinning=True)


def is_latency_bound(*, was: bool, rows: int, max_batch_size: int) -> bool:
    """Whether the batch of ``rows`` should run on the wide session, given whether the
    previous one did (see the module docstring)."""
    if rows >= max_batch_size:
        return False
    if rows <= max(1, max_batch_size // 4):
        return True
    return was


def runs_on_event_loop(*, rows: int, has_latency_session: bool, instances: int) -> bool:
    """Whether a batch runs on the thread that awaits it (the event loop) rather than on an
    executor thread: a one-row batch of a one-instance model small enough for a latency
    session. Such a run takes about what the two hand-offs to an executor thread and back
    cost (85 against 58 us on the 2-core VM, light MLP on the spinning pool), and it saves a
    quarter of the round trip at c=1 (3,220 against 2,432 infer/s; c=8 and c=64 unchanged).
    With one instance a one-row batch means nothing else was waiting; with several, idle
    instances take one-row batches under load too, and running them on the loop cost the
    demo model (two instances) a quarter of its closed-loop capacity at c=8 (6,834 against
    9,043 requests/s)."""
    return has_latency_session and rows == 1 and instances == 1
