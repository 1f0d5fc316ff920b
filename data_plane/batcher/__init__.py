"""The dynamic batcher: Triton's request queue, batch forming and instance dispatch.

A :class:`Batcher` sits between the request handlers and one loaded engine (it wraps
``runtime.infer``, it does not patch it). Each request waits in a bounded queue per
priority level; every idle instance takes the next batch the queue gives under Triton's
dynamic batcher rules (``GetDynamicBatch`` in ``dynamic_batch_scheduler.cc``), runs it,
and hands every request its own rows of the outputs.

How it maps onto Triton:

* One asyncio task per model instance, each running one execution at a time. An idle
  instance forms the next batch itself, one at a time (a lock), as Triton's per-runner
  scheduler threads did; so a batch forms only when an instance is free, and requests
  that arrive while every instance is busy pile up into bigger batches.
* The walk visits priority levels in order (1 first), FIFO within a level, a level's
  timed-out DELAY requests after its unexpired ones. It applies the queue policy to each
  request it reaches: expired REJECT requests fail, expired DELAY requests move back.
* REJECT timeouts also fire on their own (one loop timer per such request) so that a
  request times out while every instance is busy; DELAY needs no timer because moving a
  request back only matters to the next walk, which applies the policy itself.
* Decisions read time only from the injected clock; loop timers only say when to look.

Not here: Triton's payload prefetching and merging of formed-but-unstarted batches (a
batch forms only when an instance is free, so it is never formed early), the response
cache and ``preserve_ordering``.

Costs: :meth:`Batcher.submit` is O(number of inputs). Forming a batch is O(requests it
walks). While an idle instance waits out ``max_queue_delay_us`` every arrival re-walks
the pending requests, as Triton does when shapes must be checked.

Modules: `policy` (the rules a model config sets), `queue` (the priority queues and the
batch-forming walk), `scheduler` (the `Batcher`: instance tasks, execution, close).
"""

from __future__ import annotations

from data_plane.batcher.policy import BatchPolicy, QueuePolicy
from data_plane.batcher.queue import BatchedResult
from data_plane.batcher.scheduler import Batcher, Execute, ExecuteRequests

__all__ = ["BatchPolicy", "BatchedResult", "Batcher", "Execute", "ExecuteRequests", "QueuePolicy"]
