"""Sticky routing for sequence models: every request of a sequence goes to the replica that
started it.

A sequence model (Triton's sequence batcher) keeps a sequence's state on the replica whose
batcher took its START request, so its later requests must go there too. The activator
learns of sequences from the requests themselves: :func:`sequence_tag` reads the
``sequence_id``, ``sequence_start`` and ``sequence_end`` parameters of an infer body (only
bodies that name ``sequence_id`` are parsed), and :class:`SequenceBindings` remembers, per
model and correlation ID, the worker a sequence runs on: bound at START, dropped at END, or
once the sequence has been idle for ``idle_s`` (the worker ends it on its own idle limit),
in a table bounded in size (the least recently used binding goes first).

A request whose sequence is bound goes to that worker; if the worker no longer serves the
model (it died, or the model was unloaded from it) the request gets
:class:`SequenceLostError` rather than another replica, which would answer that the sequence
was never started. A request with no binding (its START went through another activator
replica, or the binding aged out) goes to the replica the correlation ID hashes to
(:func:`activator.lb.choose_for_key`), which is where any activator sends the START of that
ID while the replica set is unchanged.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import orjson

from activator.errors import SequenceLostError

__all__ = ["SequenceBindings", "SequenceLostError", "SequenceTag", "sequence_tag"]

_SEQUENCE_ID: Final = b'"sequence_id"'
_UINT64_END: Final = 1 << 64

CorrelationId = int | str


@dataclass(frozen=True, slots=True)
class SequenceTag:
    """What an infer request says of its sequence."""

    correlation_id: CorrelationId
    is_start: bool
    is_end: bool


def sequence_tag(body: bytes, header_length: int | None = None) -> SequenceTag | None:
    """The sequence an OIP infer body belongs to; None when it names none (no
    ``sequence_id``, or 0 or "") or cannot be read (the worker will answer that).

    ``header_length`` is the ``Inference-Header-Content-Length`` of a body in Triton's
    binary tensor extension: only that JSON part is read. A body that does not contain the
    bytes ``"sequence_id"`` costs one search, not a parse.
    """
    head = body if header_length is None else body[:header_length]
    if _SEQUENCE_ID not in head:
        return None
    try:
        document = orjson.loads(head)
    except orjson.JSONDecodeError:
        return None
    parameters = document.get("parameters") if isinstance(document, dict) else None
    if not isinstance(parameters, dict):
        return None
    value = parameters.get("sequence_id")
    correlation_id: CorrelationId
    if type(value) is int and 0 < value < _UINT64_END:
        correlation_id = value
    elif isinstance(value, str) and value:
        correlation_id = value
    else:
        return None
    return SequenceTag(
        correlation_id,
        is_start=parameters.get("sequence_start") is True,
        is_end=parameters.get("sequence_end") is True,
    )


class SequenceBindings:
    """The worker each live sequence runs on, per model, as this activator routed them.

    Parameters:
        idle_s: a binding unused this long is dropped (longer than any model's
            ``max_sequence_idle_microseconds``, after which the worker ends the sequence).
        max_entries: bound on bindings; the least recently used goes first past it.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        *,
        idle_s: float,
        max_entries: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if idle_s <= 0 or max_entries < 1:
            raise ValueError("idle_s must be positive and max_entries at least 1")
        self._idle_s = idle_s
        self._max_entries = max_entries
        self._clock = clock
        # Ordered by last use, oldest first: expiry and eviction look at the front only.
        self._bindings: OrderedDict[tuple[str, CorrelationId], tuple[str, float]] = OrderedDict()
        self._live: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._bindings)

    def worker_of(self, model: str, correlation_id: CorrelationId) -> str | None:
        """The worker the sequence is bound to, or None."""
        self._expire()
        entry = self._bindings.get((model, correlation_id))
        return None if entry is None else entry[0]

    def live(self, model: str) -> int:
        """Bound sequences of ``model``."""
        self._expire()
        return self._live.get(model, 0)

    def bind(self, model: str, correlation_id: CorrelationId, worker_id: str) -> None:
        """Bind the sequence to ``worker_id`` (its START went there), or mark it used."""
        key = (model, correlation_id)
        if key in self._bindings:
            self._bindings.move_to_end(key)
        else:
            self._live[model] = self._live.get(model, 0) + 1
        self._bindings[key] = (worker_id, self._clock())
        while len(self._bindings) > self._max_entries:
            self._pop_oldest()
        self._expire()

    def unbind(self, model: str, correlation_id: CorrelationId) -> None:
        """Forget the sequence (its END went through, or its worker is gone)."""
        if self._bindings.pop((model, correlation_id), None) is not None:
            self._drop_live(model)

    def _expire(self) -> None:
        cutoff = self._clock() - self._idle_s
        while self._bindings:
            _, used_at = next(iter(self._bindings.values()))
            if used_at > cutoff:
                return
            self._pop_oldest()

    def _pop_oldest(self) -> None:
        (model, _), _ = self._bindings.popitem(last=False)
        self._drop_live(model)

    def _drop_live(self, model: str) -> None:
        left = self._live[model] - 1
        if left:
            self._live[model] = left
        else:
            del self._live[model]
