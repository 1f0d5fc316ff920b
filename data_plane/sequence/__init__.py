"""The sequence batcher: Triton's scheduler for stateful models (``sequence_batching``).

Requests carry a correlation ID (``sequence_id``) and START/END flags; every request of a
sequence goes to the slot its START took, in order, and the model gets the control tensors
(START, END, READY, CORRID) and the implicit state the config asks for as ordinary inputs.
Two strategies form batches: ``direct`` (each slot a fixed row, fillers in empty slots) and
``oldest`` (a dynamic batcher over the sequences that have a request ready). Sequences with
no free slot wait in a backlog; a sequence idle for ``max_sequence_idle_microseconds`` ends.

Modules: `table` (which sequence holds which slot: the pure decisions), `controls` (the
control tensors), `state` (implicit state), `policy` (what the config sets), `queued` (a
waiting request), `execution` (running a direct batch), `direct` and `oldest` (the lanes of
each strategy), `scheduler` (the `SequenceBatcher`: checks, routing, reaper, close),
`errors` (Triton's texts).
"""

from __future__ import annotations

from data_plane.sequence.errors import (
    MissingCorrelationIdError,
    SequenceBacklogFullError,
    SequenceBatchSizeError,
    SequenceCancelledError,
    SequenceNotStartedError,
    SequenceTimeoutError,
)
from data_plane.sequence.policy import SequencePolicy
from data_plane.sequence.scheduler import SequenceBatcher, create_sequence_batcher
from data_plane.sequence.state import StateSpec, read_states
from data_plane.sequence.table import correlation_id_of

__all__ = [
    "MissingCorrelationIdError",
    "SequenceBacklogFullError",
    "SequenceBatchSizeError",
    "SequenceBatcher",
    "SequenceCancelledError",
    "SequenceNotStartedError",
    "SequencePolicy",
    "SequenceTimeoutError",
    "StateSpec",
    "correlation_id_of",
    "create_sequence_batcher",
    "read_states",
]
