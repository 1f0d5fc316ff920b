"""Streamed OpenAI answers (``"stream": true``): an incremental Server-Sent Events reader per
connection, and what a level's streams measured.

A :class:`StreamMeter` is fed the raw body chunks of one answer as they arrive (with their
arrival time) and keeps only what the figures need: when the first ``data:`` event carrying
text came (time to first token), the gaps between later text events (inter-token latency),
the number of text events, the completion tokens of a final ``usage`` object where the server
sends one (``stream_options: {"include_usage": true}``, which the bench asks for), and whether
the stream ended properly with ``data: [DONE]``. A stream without ``[DONE]``, or with an
``event: error`` (or a ``data:`` object with an ``error``), counts as an error of kind
``stream``. Events that arrive in the same body chunk share its arrival time.

Tokens are counted from the final usage's ``completion_tokens`` when the server sends it,
else as the number of events carrying text (one token per event, as servers stream them);
:attr:`StreamMeter.tokens_from` says which.
"""

from __future__ import annotations

from array import array
from typing import Any, Final

import numpy as np
import orjson

from zeroserve.bench.stats import LatencySummary, StreamSummary

STREAM_ERROR: Final = "stream"
"""The error kind of a stream that broke off or reported an error."""
_MAX_LINE: Final = 1 << 20
"""A line longer than this without a newline is not SSE: the stream counts as broken."""


class StreamMeter:
    """The SSE reader of one connection, reset before each request (:meth:`reset`)."""

    __slots__ = (
        "_buffer",
        "first_ns",
        "last_ns",
        "gaps_ns",
        "chunks",
        "usage_tokens",
        "is_done",
        "is_error",
    )

    def __init__(self) -> None:
        self._buffer = b""
        self.first_ns = 0
        """Arrival of the first event carrying text; 0 before."""
        self.last_ns = 0
        self.gaps_ns: list[int] = []
        """Between consecutive text events, after the first."""
        self.chunks = 0
        """Events carrying text."""
        self.usage_tokens: int | None = None
        self.is_done = False
        self.is_error = False

    def reset(self) -> None:
        self._buffer = b""
        self.first_ns = self.last_ns = self.chunks = 0
        self.gaps_ns = []
        self.usage_tokens = None
        self.is_done = self.is_error = False

    @property
    def is_complete(self) -> bool:
        """Ended with ``[DONE]`` and no error."""
        return self.is_done and not self.is_error

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.chunks

    @property
    def tokens_from(self) -> str:
        return "usage" if self.usage_tokens is not None else "chunks"

    def feed(self, data: bytes, at_ns: int) -> None:
        """One raw body chunk that arrived at ``at_ns`` (``perf_counter_ns``)."""
        buffer = self._buffer + data if self._buffer else data
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            self._line(buffer[start:end].rstrip(b"\r"), at_ns)
            start = end + 1
        self._buffer = buffer[start:]
        if len(self._buffer) > _MAX_LINE:
            self.is_error = True
            self._buffer = b""

    def _line(self, line: bytes, at_ns: int) -> None:
        if line.startswith(b"data:"):
            self._data(line[5:].strip(), at_ns)
        elif line.startswith(b"event:") and line[6:].strip() == b"error":
            self.is_error = True
        # Blank lines, comments (":"), id: and retry: carry nothing measured.

    def _data(self, payload: bytes, at_ns: int) -> None:
        if payload == b"[DONE]":
            self.is_done = True
            return
        try:
            document = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.is_error = True
            return
        if not isinstance(document, dict):
            return
        if "error" in document:
            self.is_error = True
            return
        usage = document.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        if _has_text(document.get("choices")):
            if self.first_ns:
                self.gaps_ns.append(at_ns - self.last_ns)
            else:
                self.first_ns = at_ns
            self.last_ns = at_ns
            self.chunks += 1


def _has_text(choices: Any) -> bool:
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        text = choice.get("text")
        if text is None:
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(text, str) and text:
            return True
    return False


class StreamRecorder:
    """Each successful stream of a level, kept until the level's figures are made."""

    def __init__(self) -> None:
        self._done_ns = array("q")
        self._ttft_ns = array("q")
        self._tokens = array("q")
        self._gap_done_ns = array("q")
        self._gaps_ns = array("q")
        self._from_usage = 0
        self._from_chunks = 0

    def record(self, meter: StreamMeter, sent_ns: int, done_ns: int) -> None:
        self._done_ns.append(done_ns)
        self._ttft_ns.append(meter.first_ns - sent_ns if meter.first_ns else -1)
        self._tokens.append(meter.tokens)
        if meter.gaps_ns:
            self._gaps_ns.extend(meter.gaps_ns)
            self._gap_done_ns.extend([done_ns] * len(meter.gaps_ns))
        if meter.usage_tokens is not None:
            self._from_usage += 1
        else:
            self._from_chunks += 1

    def summary(self, start_ns: int, end_ns: int, duration_s: float) -> StreamSummary:
        """The streams that completed in ``[start_ns, end_ns)``."""
        done = np.frombuffer(self._done_ns, dtype=np.int64)
        ttft = np.frombuffer(self._ttft_ns, dtype=np.int64)
        tokens = np.frombuffer(self._tokens, dtype=np.int64)
        in_window = (done >= start_ns) & (done < end_ns)
        gap_done = np.frombuffer(self._gap_done_ns, dtype=np.int64)
        gaps = np.frombuffer(self._gaps_ns, dtype=np.int64)
        gaps_in_window = (gap_done >= start_ns) & (gap_done < end_ns)
        total = int(tokens[in_window].sum())
        if self._from_usage and self._from_chunks:
            tokens_from = "mixed"
        else:
            tokens_from = "usage" if self._from_usage else "chunks"
        return StreamSummary(
            streams=int(np.count_nonzero(in_window)),
            ttft=LatencySummary.from_ns(ttft[in_window & (ttft >= 0)]),
            itl=LatencySummary.from_ns(gaps[gaps_in_window]),
            tokens=total,
            tokens_per_s=total / duration_s if duration_s > 0 else 0.0,
            tokens_from=tokens_from,
        )
