"""An activation timeline as bars, one per phase, on a common time axis.

A finished, successful timeline's ``phases`` are the moments each step *ended* (the worker
was ready, the files were fetched, the engine was built, ...), so a bar runs from the mark
before to its own. A running or failed one's phases after ``queued`` are the moments each
step *began* (``worker_starting``, ``loading``), so a bar runs from its mark to the next, the
last one to the end (or to now, while it runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Bar", "bars"]

_ENDED = {
    "worker_process": "wait for a worker",
    "worker_ready": "worker start",
    "fetched": "fetch",
    "engine_built": "engine build",
    "wake": "wake",
    "ready": "publish",
    "first_response": "first response",
}
_BEGAN = {"queued": "placement", "worker_starting": "worker start", "loading": "load"}
_SUCCESS = ("ready", "revived", "woken")


@dataclass(frozen=True, slots=True)
class Bar:
    """One phase: its name and when it ran, in seconds since the activation was queued."""

    label: str
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def bars(timeline: dict[str, Any], *, now_s: float | None = None) -> list[Bar]:
    """The bars of ``timeline``; ``now_s`` (seconds since queued) ends a running one's
    last bar."""
    marks = [(str(p["phase"]), float(p["at_s"])) for p in timeline.get("phases") or ()]
    if not marks:
        return []
    if timeline.get("outcome") in _SUCCESS:
        result, previous = [], marks[0][1]
        for phase, at in marks[1:]:
            result.append(Bar(_ENDED.get(phase, phase), previous, at))
            previous = at
        return result
    total = (timeline.get("durations_s") or {}).get("total")
    end = float(total) if isinstance(total, int | float) else (now_s or marks[-1][1])
    ends = [at for _, at in marks[1:]] + [max(end, marks[-1][1])]
    return [
        Bar(_BEGAN.get(phase, phase), at, stop)
        for (phase, at), stop in zip(marks, ends, strict=True)
    ]
