"""One trace setting in force: its values, the sampling of requests under it, and the
finished traces it holds until they are written.

As in Triton, a setting is replaced, never changed, when a client updates it: its counters
(the requests seen, the traces still to take) start again in the new one, and the old one
writes out what it holds (:meth:`TraceSetting.retire`); traces still running under it are
written when they finish.

When its traces are written follows Triton's ``TraceSetting::WriteTrace``: every
``log_frequency`` traces to the next numbered file; when ``trace_count`` runs out and every
trace taken has finished, to the next numbered file too; otherwise to the trace file when
the setting retires. A setting holds at most ``buffer_traces`` finished traces: past that,
with a log frequency of 0, they go to the trace file early (Triton holds them all).
"""

from __future__ import annotations

from typing import Protocol

from data_plane.trace.record import TraceRecord
from data_plane.trace.values import TraceLevel, TraceValues
from data_plane.trace.writer import TraceFile


class SpanSink(Protocol):
    """Where traces go in trace mode ``opentelemetry``, each as it finishes."""

    def export(self, record: TraceRecord) -> None: ...


class TraceSetting:
    """The trace setting of the server, or of one model, until it is replaced.

    ``specified`` names the fields set for it rather than taken from the setting it falls
    back to (the server's, for a model; the start-up values, for the server). With
    ``spans`` (trace mode ``opentelemetry``) each trace goes there as it finishes, and the
    file settings play no part.
    """

    __slots__ = (
        "_buffer_traces",
        "_collected",
        "_file",
        "_is_retired",
        "_sampled",
        "_spans",
        "_stream",
        "count",
        "invalid_reason",
        "level",
        "log_frequency",
        "rate",
        "specified",
    )

    def __init__(
        self,
        *,
        level: TraceLevel,
        rate: int,
        count: int,
        log_frequency: int,
        file: TraceFile,
        specified: frozenset[str],
        buffer_traces: int,
        spans: SpanSink | None = None,
    ) -> None:
        self.level = level
        self.rate = rate
        self.count = count
        """Traces still to take; -1 has no bound. Clients read it as ``trace_count``."""
        self.log_frequency = log_frequency
        self.specified = specified
        self._file = file
        self._buffer_traces = buffer_traces
        self._sampled = 0
        self._collected = 0
        self._stream: list[TraceRecord] = []
        self._is_retired = False
        self._spans = spans
        self.invalid_reason = ""
        """Why no request can be traced under this setting (Triton's texts); empty if one can."""
        if not level:
            self.invalid_reason = "tracing is disabled"
        elif rate == 0:
            self.invalid_reason = "sample rate must be non-zero"
        elif not file.path and spans is None:
            self.invalid_reason = "trace file name is not given"

    @property
    def is_valid(self) -> bool:
        """Whether requests may still be traced: a reason-free setting with traces left."""
        return not self.invalid_reason and self.count != 0

    def values(self) -> TraceValues:
        return TraceValues(
            level=self.level,
            rate=self.rate,
            count=self.count,
            log_frequency=self.log_frequency,
            file=self._file.path,
            mode="triton" if self._spans is None else "opentelemetry",
        )

    def sample(self) -> bool:
        """Whether the request arriving now is traced: every ``rate``-th one while
        ``count`` lasts (which this takes one from)."""
        if not self.is_valid:
            return False
        self._sampled += 1
        if self._sampled % self.rate:
            return False
        if self.count > 0:
            self.count -= 1
        return True

    def collect(self, record: TraceRecord) -> None:
        """Take a finished trace, and write what is due."""
        if self._spans is not None:
            self._collected += 1
            self._spans.export(record)
            return
        stream = self._stream
        stream.append(record)
        self._collected += 1
        if self._is_retired:
            self._flush()
        elif (self.count == 0 and self._collected == self._sampled) or (
            self.log_frequency and len(stream) >= self.log_frequency
        ):
            self._file.write_numbered(stream)
            self._stream = []
        elif not self.log_frequency and len(stream) >= self._buffer_traces:
            self._file.append(stream)
            self._stream = []

    def retire(self) -> None:
        """The setting was replaced (or the server stops): write what it holds."""
        self._is_retired = True
        if self._stream:
            self._flush()

    def _flush(self) -> None:
        if self.log_frequency:
            self._file.write_numbered(self._stream)
        else:
            self._file.append(self._stream)
        self._stream = []
