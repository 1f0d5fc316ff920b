"""The messages between the local backend and its worker template, one JSON object a line
over a Unix stream socket.

The template (``python -m data_plane.template``) is a process that has imported the data
plane and forks a worker per request. It speaks first, once, with `Ready`; then each
`ForkRequest` gets a `Forked` or a `Refused` with the same ``id``, and every worker it forked
is reported by an `Exited` when the template has reaped it. Both sides live in different
layers (the control plane must not import the data plane), so the vocabulary lives here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Final

__all__ = [
    "MAX_LINE_BYTES",
    "Exited",
    "ForkRequest",
    "Forked",
    "Ready",
    "Refused",
    "TemplateMessage",
    "decode",
    "encode",
]

MAX_LINE_BYTES: Final = 1 << 20
"""The longest message either side accepts (a request carries a worker's settings)."""


@dataclass(frozen=True, slots=True)
class Ready:
    """The template has imported what it preloads and waits for requests."""

    pid: int
    threads: int
    """``threading.active_count()`` in the template: 1, or it would not fork."""
    imports_s: float
    """Seconds its imports took (what each forked worker no longer spends)."""


@dataclass(frozen=True, slots=True)
class ForkRequest:
    """Fork one worker and run the data plane in it with ``settings``."""

    id: int
    worker_id: str
    settings: dict[str, Any]
    """`DataPlaneSettings` fields, as JSON; the environment supplies the rest, as for a
    ``python -m data_plane`` worker."""
    log_path: str | None = None
    """Where the worker's stdout and stderr go; None keeps the template's."""


@dataclass(frozen=True, slots=True)
class Forked:
    """Request ``id``'s worker runs as ``pid`` (its own session and process group)."""

    id: int
    pid: int


@dataclass(frozen=True, slots=True)
class Refused:
    """Request ``id`` got no worker, and why."""

    id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Exited:
    """Worker ``pid`` exited and was reaped; ``returncode`` as `subprocess` gives it
    (negative: the signal that ended it)."""

    pid: int
    returncode: int


TemplateMessage = Ready | ForkRequest | Forked | Refused | Exited

_TYPES: Final[dict[str, type[TemplateMessage]]] = {
    "ready": Ready,
    "fork": ForkRequest,
    "forked": Forked,
    "refused": Refused,
    "exited": Exited,
}
_NAMES: Final = {cls: name for name, cls in _TYPES.items()}


def encode(message: TemplateMessage) -> bytes:
    """One line: the message's fields and its ``type``."""
    doc = {"type": _NAMES[type(message)], **asdict(message)}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> TemplateMessage:
    """The message on ``line``; ValueError for anything else."""
    try:
        doc = json.loads(line)
        cls = _TYPES[doc.pop("type")]
        return cls(**doc)
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a worker-template message: {line[:200]!r}") from exc
