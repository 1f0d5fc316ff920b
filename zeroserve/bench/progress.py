"""Progress on stderr while levels run: a redrawn bar on a terminal, plain lines otherwise.

The bar is redrawn from a timer a few times a second, reading the running level's counters;
nothing is done per request. Written to a pipe or a file (CI logs), only one line at the
start and one at the end of each level, without carriage returns.
"""

from __future__ import annotations

import time
from typing import Final, Literal, Protocol, TextIO

from zeroserve.bench.stats import LevelResult

REDRAW_S: Final = 0.25
_BAR_WIDTH: Final = 24
Style = Literal["bar", "plain", "none"]
_STYLES: Final[dict[str, Style]] = {"bar": "bar", "plain": "plain", "none": "none"}


class RunningLevel(Protocol):
    """What the bar reads from a running loop."""

    @property
    def answered(self) -> int: ...

    @property
    def failed(self) -> int: ...

    @property
    def started_ns(self) -> int: ...

    @property
    def window_start_ns(self) -> int: ...

    @property
    def window_end_ns(self) -> int: ...


class Progress:
    """Reports level starts, redraws and results to ``stream`` in the chosen style."""

    def __init__(self, stream: TextIO, style: Style) -> None:
        self._stream = stream
        self.style = style
        self._label = ""
        self._position = ""
        self._last_answered = 0
        self._last_ns = 0
        self._rate = 0.0
        self._is_drawn = False

    @classmethod
    def for_stream(cls, stream: TextIO, requested: str) -> Progress:
        """``auto`` is a bar when ``stream`` is a terminal, plain lines otherwise."""
        if requested == "auto":
            is_tty = getattr(stream, "isatty", None)
            return cls(stream, "bar" if is_tty is not None and is_tty() else "plain")
        style = _STYLES.get(requested)
        if style is None:
            raise ValueError(f"unknown progress style {requested!r}")
        return cls(stream, style)

    def level_started(self, index: int, count: int, label: str, seconds: float) -> None:
        self._label = label
        self._position = f"[{index + 1}/{count}]"
        self._last_answered = 0
        self._last_ns = time.perf_counter_ns()
        self._rate = 0.0
        if self.style == "plain":
            self._write(f"{self._position} {label}: running for {seconds:g} s\n")

    def redraw(self, level: RunningLevel) -> None:
        if self.style != "bar" or not level.started_ns:
            return
        now = time.perf_counter_ns()
        if now > self._last_ns:
            rate = (level.answered - self._last_answered) * 1e9 / (now - self._last_ns)
            # Smoothed, so the figure can be read while it changes.
            self._rate = rate if not self._rate else 0.5 * self._rate + 0.5 * rate
        self._last_answered, self._last_ns = level.answered, now
        total = max(level.window_end_ns - level.started_ns, 1)
        share = min(max((now - level.started_ns) / total, 0.0), 1.0)
        filled = int(share * _BAR_WIDTH)
        phase = "warm-up" if now < level.window_start_ns else "measure"
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        line = (
            f"{self._position} {self._label:<14} {phase:<7} [{bar}] {share * 100:3.0f}%  "
            f"{level.answered:>9,} done  {level.failed:>6,} errors  {self._rate:>9,.0f}/s"
        )
        self._write("\r" + line + "\x1b[K")
        self._is_drawn = True

    def level_done(self, result: LevelResult) -> None:
        if self.style == "none":
            return
        if self._is_drawn:
            self._write("\r\x1b[K")
            self._is_drawn = False
        self._write(
            f"{self._position} {result.label}: {result.throughput:,.1f}/s, "
            f"p50 {result.latency.p50_ms:.2f} ms, p99 {result.latency.p99_ms:.2f} ms, "
            f"{result.error_count:,} errors\n"
        )

    def _write(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()
