"""Batching and queueing rules: `BatchPolicy` and `QueuePolicy`, read from a model config.

Owns what the batcher takes from a model's configuration (``dynamic_batching``, instance
groups) with Triton's defaults, and the checks a hand-built policy gets so that the queue and
the scheduler can rely on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from foundation.proto.model_config_pb2 import ModelConfig, ModelQueuePolicy


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy`` for one priority level."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    """What happens to a request still queued at its timeout: fail it, or move it back."""
    default_timeout_us: int = 0
    """How long a request may wait in the queue; 0 is no limit."""
    allow_timeout_override: bool = False
    """A request's own timeout counts when it is non-zero and shorter than the default."""
    max_queue_size: int = 0
    """Queued requests this level holds (delayed ones included); 0 leaves only the hard bound."""


@dataclass(frozen=True)
class BatchPolicy:
    """Everything the batcher takes from a model's config, with Triton's defaults."""

    max_batch_size: int = 0
    """Most rows in one execution; 0 turns batching off (one request per execution)."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """Batch sizes sent as soon as reached; sorted, and ``(max_batch_size,)`` when empty."""
    max_queue_delay_us: int = 0
    """How long the oldest request may wait for a fuller batch; 0 sends what there is."""
    priority_levels: int = 0
    """Number of priority levels (1 is served first); 0 is one level and no priorities."""
    default_priority_level: int = 0
    """The level of requests with priority 0 or above ``priority_levels``."""
    default_queue_policy: QueuePolicy = QueuePolicy()
    """The queue policy of levels ``priority_queue_policies`` does not name."""
    priority_queue_policies: Mapping[int, QueuePolicy] = field(default_factory=dict)
    """Queue policy by priority level; only read when ``priority_levels`` is set."""
    instance_count: int = 1
    """Executions that may run at once (the model's instances)."""
    queue_bound: int = 4096
    """Hard bound on queued requests, whatever the config says; beyond it QueueFullError."""

    def __post_init__(self) -> None:
        # Normally model_config.normalize has checked all of this with Triton's texts; a
        # policy built by hand gets the same checks so that the batcher can rely on them.
        if self.max_batch_size < 0:
            raise ValueError("'max_batch_size' must be non-negative value")
        for size in self.preferred_batch_sizes:
            if size <= 0:
                raise ValueError("dynamic batching preferred size must be positive")
            if size > self.max_batch_size:
                raise ValueError("dynamic batching preferred size must be <= max batch size")
        preferred = tuple(sorted(set(self.preferred_batch_sizes)))
        if not preferred and self.max_batch_size > 0:
            preferred = (self.max_batch_size,)
        object.__setattr__(self, "preferred_batch_sizes", preferred)
        levels = self.priority_levels
        if levels:
            if not 1 <= self.default_priority_level <= levels:
                raise ValueError(f"default priority level must be in range [1, {levels}]")
            for level in self.priority_queue_policies:
                if not 1 <= level <= levels:
                    raise ValueError(
                        f"priority queue policy must have priority level in range [1, {levels}]"
                    )
        if self.instance_count < 1:
            raise ValueError("instance_count must be at least 1")
        if self.queue_bound < 1:
            raise ValueError("queue_bound must be at least 1")

    @classmethod
    def from_config(cls, config: ModelConfig, *, queue_bound: int = 4096) -> BatchPolicy:
        """The policy a (normalized) model config asks for.

        Without ``dynamic_batching`` this is Triton's default scheduler: batching off even
        when ``max_batch_size`` > 0, one level, no timeouts, still one execution per
        instance at a time. The instance count is the sum of the groups' counts.
        """
        instance_count = sum(max(group.count, 1) for group in config.instance_group) or 1
        if not config.HasField("dynamic_batching"):
            return cls(instance_count=instance_count, queue_bound=queue_bound)
        batching = config.dynamic_batching
        return cls(
            max_batch_size=config.max_batch_size,
            preferred_batch_sizes=tuple(batching.preferred_batch_size),
            max_queue_delay_us=batching.max_queue_delay_microseconds,
            priority_levels=batching.priority_levels,
            default_priority_level=batching.default_priority_level,
            default_queue_policy=_queue_policy(batching.default_queue_policy),
            priority_queue_policies={
                level: _queue_policy(policy)
                for level, policy in batching.priority_queue_policy.items()
            },
            instance_count=instance_count,
            queue_bound=queue_bound,
        )


def _queue_policy(message: ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        timeout_action="DELAY" if message.timeout_action == ModelQueuePolicy.DELAY else "REJECT",
        default_timeout_us=message.default_timeout_microseconds,
        allow_timeout_override=message.allow_timeout_override,
        max_queue_size=message.max_queue_size,
    )
