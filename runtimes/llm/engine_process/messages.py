"""What the server and its engine process say to each other: one class per message kind.

The messages travel over a socket pair with :class:`multiprocessing.connection.Connection`
framing, pickled: both ends are our own processes (the server and the child it started), and
nothing read from storage or from a client is ever unpickled.

Server to engine: :class:`LoadModel` first, then :class:`Batch` (the :class:`Add` and
:class:`Cancel` of one event-loop iteration), :class:`Call` and :class:`Stop`. Engine to
server: :class:`Ready` or :class:`LoadFailed`, then :class:`Tokens`, :class:`LoadCounts`,
:class:`Reply` and :class:`Fatal`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

WireUpdate = tuple[str, tuple[int, ...], bool, str | None]
"""A :class:`~runtimes.llm.hf_engine.TokenUpdate` as :class:`Tokens` carries it: request id,
new tokens, finished, error. A plain tuple: a step's updates cost a few microseconds less to
pickle each than a dataclass would, on both sides of every engine step."""

CallName = Literal["sleep", "wake"]
"""The engine operations :class:`Call` runs."""


# ---- server to engine ----


@dataclass(frozen=True, slots=True)
class LoadModel:
    """Load the model folder; always the first message, answered by Ready or LoadFailed."""

    folder: str
    device: str
    parameters: dict[str, Any]
    """The engine parameters read from the model config (``runtimes.llm.hf.OPTIONS``)."""
    fallback_eos_ids: frozenset[int]
    """End-of-sequence ids to use when the model's generation config names none."""


@dataclass(frozen=True, slots=True)
class Add:
    """Start generating for one request."""

    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop one request and free what it holds; nothing if it is gone."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Batch:
    """The adds and cancels of one server event-loop iteration, in order."""

    commands: list[Add | Cancel]


@dataclass(frozen=True, slots=True)
class Call:
    """Run ``name`` in the engine; answered by a Reply with the same ``seq``."""

    seq: int
    name: CallName


@dataclass(frozen=True, slots=True)
class Stop:
    """Free the engine and exit."""


ToEngine = LoadModel | Batch | Call | Stop
"""Every message the server sends."""


# ---- engine to server ----


@dataclass(frozen=True, slots=True)
class Ready:
    """The model is loaded."""

    max_model_len: int
    eos_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LoadFailed:
    """The model could not be loaded; the engine process exits."""

    reason: str


@dataclass(frozen=True, slots=True)
class Tokens:
    """What one engine step gave its requests, and the engine's queues after it."""

    updates: list[WireUpdate]
    running: int
    waiting: int


@dataclass(frozen=True, slots=True)
class LoadCounts:
    """The engine's queues changed while no tokens carried them (requests ended)."""

    running: int
    waiting: int


@dataclass(frozen=True, slots=True)
class Reply:
    """The outcome of the Call numbered ``seq``: None, or why it failed."""

    seq: int
    error: str | None


@dataclass(frozen=True, slots=True)
class Fatal:
    """The engine stopped for good (its generation thread died)."""

    reason: str


FromEngine = Ready | LoadFailed | Tokens | LoadCounts | Reply | Fatal
"""Every message the engine process sends."""
