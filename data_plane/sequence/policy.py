"""What the sequence batcher takes from a model's config, with Triton's defaults.

Slots: Triton gives each model instance ``max(1, max_batch_size)`` slots under the direct
strategy and ``max_candidate_sequences`` (when set, else the same) under the oldest. A
zeroserve runtime runs its instances as one engine, so here the instances' slots form
*lanes*: one lane per instance, each with its own slots and at most one execution at a time
(direct) or its own dynamic batcher (oldest), which is how Triton schedules them; which of
the engine's instances runs a lane's execution is the runtime's choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from data_plane.sequence.state import StateSpec
from foundation.proto.model_config_pb2 import ModelConfig
from foundation.sequence_config import Control, controls


@dataclass(frozen=True)
class SequencePolicy:
    """Everything the sequence batcher takes from a model's (normalized) config."""

    model: str
    strategy: Literal["direct", "oldest"]
    max_batch_size: int
    """The model's; 0 means requests carry no batch dimension and a lane runs one at a time."""
    lanes: int
    """Model instances: lanes of slots, each running its own executions."""
    slots_per_lane: int
    idle_us: int
    """``max_sequence_idle_microseconds``: a sequence idle longer is ended."""
    controls: tuple[Control, ...] = ()
    states: tuple[StateSpec, ...] = ()
    max_queue_delay_us: int = 0
    """The strategy's ``max_queue_delay_microseconds``."""
    minimum_slot_utilization: float = 0.0
    """Direct: the share of a lane's slots with a request at which a batch goes before the
    delay runs out (0 sends at once)."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """Oldest: the dynamic batcher's preferred sizes."""
    queue_bound: int = 4096
    """Requests queued (in slots and the backlog) and sequences backlogged, at most."""

    def __post_init__(self) -> None:
        if self.lanes < 1 or self.slots_per_lane < 1:
            raise ValueError("a sequence batcher needs at least one lane of one slot")
        if self.queue_bound < 1:
            raise ValueError("queue_bound must be at least 1")

    @classmethod
    def from_config(
        cls,
        config: ModelConfig,
        *,
        instance_count: int,
        states: tuple[StateSpec, ...] = (),
        queue_bound: int = 4096,
    ) -> SequencePolicy:
        """The policy of a normalized config with ``sequence_batching``, its states read
        (``state.read_states``)."""
        batching = config.sequence_batching
        slots = max(1, config.max_batch_size)
        if batching.HasField("oldest"):
            oldest = batching.oldest
            return cls(
                model=config.name,
                strategy="oldest",
                max_batch_size=config.max_batch_size,
                lanes=instance_count,
                slots_per_lane=oldest.max_candidate_sequences or slots,
                idle_us=batching.max_sequence_idle_microseconds,
                controls=controls(batching),
                states=states,
                max_queue_delay_us=oldest.max_queue_delay_microseconds,
                preferred_batch_sizes=tuple(oldest.preferred_batch_size),
                queue_bound=queue_bound,
            )
        direct = batching.direct
        return cls(
            model=config.name,
            strategy="direct",
            max_batch_size=config.max_batch_size,
            lanes=instance_count,
            slots_per_lane=slots,
            idle_us=batching.max_sequence_idle_microseconds,
            controls=controls(batching),
            states=states,
            max_queue_delay_us=direct.max_queue_delay_microseconds,
            minimum_slot_utilization=direct.minimum_slot_utilization,
            queue_bound=queue_bound,
        )
