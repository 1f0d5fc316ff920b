"""What the reaper knows of one model's idle periods, updated from traffic reports.

Pure: :func:`track` takes the state, what the activators report and ``now`` (wall clock:
reports carry wall-clock times), and returns the new state and whether it learned an idle
time (the caller then persists it, as it does when ``idle_since`` is newly set, so a
restarted or failed-over control plane remembers both the history and the idle period
under way, whose reports may have expired).
An idle period starts when nothing is in flight (at the last request's arrival, the latest
the reports say) and ends when a later request arrives; sweeps run every second or so, so
the gap is measured to within a sweep.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Self

from control_plane.keepalive.history import IdleHistory

__all__ = ["STATE_KEY", "IdleTracker", "track"]

STATE_KEY = "keepalive"
"""The key the tracker is kept under in the state store (``put_model_state``)."""


@dataclass(frozen=True, slots=True)
class IdleTracker:
    """A model's idle-time history and its current idle period."""

    history: IdleHistory
    idle_since: float | None = None
    """Wall-clock time the current idle period began; None while busy or never seen."""
    prewarmed_for: float | None = None
    """``idle_since`` of the idle period already pre-warmed (one pre-warm per period)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "history": self.history.to_json(),
            "idle_since": self.idle_since,
            "prewarmed_for": self.prewarmed_for,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        return cls(
            history=IdleHistory.from_json(doc["history"]),
            idle_since=doc.get("idle_since"),
            prewarmed_for=doc.get("prewarmed_for"),
        )


def track(
    state: IdleTracker, *, last_request_at: float | None, in_flight: int, now: float
) -> tuple[IdleTracker, bool]:
    """The state after a sweep that saw ``in_flight`` requests and a last arrival at
    ``last_request_at`` (None: no report); True when an idle time was learned."""
    if last_request_at is None:
        return state, False
    since = state.idle_since
    if since is not None and last_request_at > since:
        # A request came after the idle period began: that period is one idle time.
        history = state.history.observe(
            last_request_at - since, ended_at=last_request_at, requests=1.0, now=now
        )
        busy = in_flight > 0
        return (
            IdleTracker(
                history=history,
                idle_since=None if busy else last_request_at,
                prewarmed_for=None,
            ),
            True,
        )
    if in_flight > 0:
        return replace(state, idle_since=None), False
    if since is None:
        return replace(state, idle_since=last_request_at), False
    return state, False
