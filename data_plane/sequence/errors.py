"""The sequence batcher's errors, with Triton's texts (``sequence_batch_scheduler.cc`` and
``sequence_utils.h``); their parents give them their status on every transport."""

from __future__ import annotations

from data_plane.errors import (
    InvalidArgumentError,
    QueueFullError,
    UnavailableError,
    request_prefix,
)


class MissingCorrelationIdError(InvalidArgumentError):
    """A request to a sequence model without a correlation ID (none, 0 or "")."""

    def __init__(self, *, model: str) -> None:
        super().__init__(
            f"inference request to model '{model}' must specify a non-zero or non-empty "
            "correlation ID"
        )
        self.model = model


class SequenceNotStartedError(InvalidArgumentError):
    """A request without the START flag for a correlation ID with no sequence running:
    never started, already ended, or released after ``max_sequence_idle_microseconds``."""

    def __init__(self, *, model: str, correlation_id: int | str) -> None:
        super().__init__(
            f"inference request for sequence {correlation_id} to model '{model}' must specify "
            "the START flag on the first request of the sequence"
        )
        self.model = model
        self.correlation_id = correlation_id


class SequenceBatchSizeError(InvalidArgumentError):
    """A request of more than one row to a batching sequence model."""

    def __init__(self, *, model: str) -> None:
        super().__init__(
            f"inference request to model '{model}' must specify batch-size 1 due to "
            "requirements of sequence batcher"
        )
        self.model = model


class SequenceTimeoutError(UnavailableError):
    """The sequence waited for a free slot (in the backlog) past a request's ``timeout``."""

    def __init__(self) -> None:
        super().__init__("timeout of the corresponding sequence has been expired")


class SequenceCancelledError(UnavailableError):
    """An earlier request of the sequence was cancelled, which ends the sequence (as in
    Triton); the requests queued behind it fail with this."""

    def __init__(self, *, model: str, correlation_id: int | str) -> None:
        super().__init__(
            f"sequence {correlation_id} of model '{model}' ended: an earlier request of it "
            "was cancelled"
        )
        self.model = model
        self.correlation_id = correlation_id


class SequenceBacklogFullError(QueueFullError):
    """Every slot is taken and the backlog holds as many sequences or requests as it may:
    Triton's backlog is unbounded, zeroserve's is bounded by the batcher's queue bound."""

    def __init__(self, *, model: str, request_id: str | None = None) -> None:
        UnavailableError.__init__(
            self,
            f"{request_prefix(request_id)}Exceeds maximum queue size: model '{model}' has no "
            "free sequence slot and its sequence backlog is full",
        )
        self.model = model
