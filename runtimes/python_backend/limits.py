"""How long the server waits on a model's stubs, how much shared memory they may use and at
what priority their native threads run: defaults, and the model configuration parameters
that change them.

Parameters (``parameters { key: "execute_timeout_s" value: { string_value: "60" } }``):
``stub_timeout_s`` (start-up, finalize, exit), ``load_timeout_s`` (import and
``initialize``), ``execute_timeout_s`` (one ``execute``; past it the stub is stopped and
the model fails), ``shm_limit_bytes`` (the most each direction's shared memory of one
instance may grow to) and ``native_threads`` (``idle`` or ``normal``:
:mod:`.native_threads`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from foundation.proto import model_config_pb2 as mc
from runtimes.python_backend import native_threads


@dataclass(frozen=True)
class StubLimits:
    """How long the server waits on a stub, and how much shared memory it may use."""

    stub_timeout_s: float = 30.0
    """Start-up until ``hello``, ``finalize``, and the process's exit after it (Triton's
    ``stub-timeout-seconds``)."""
    load_timeout_s: float = 600.0
    """Importing ``model.py`` and ``initialize`` (or ``auto_complete_config``)."""
    execute_timeout_s: float = 600.0
    """One ``execute`` call; past it the stub is stopped and the model fails."""
    shm_initial_bytes: int = 1 << 20
    """Each arena's size at start; it grows as messages need."""
    shm_limit_bytes: int = 1 << 30
    """The most each arena (one per direction) may grow to."""
    native_threads: str = "idle"
    """The priority of the threads the model's libraries start outside Python."""


_PARAMETERS = ("stub_timeout_s", "load_timeout_s", "execute_timeout_s", "shm_limit_bytes")


def limits_for(config: mc.ModelConfig) -> StubLimits:
    """The defaults, with what ``config``'s parameters set; ValueError naming a bad one."""
    limits = StubLimits()
    types = {f.name: f.type for f in fields(StubLimits)}
    changes: dict[str, float | int | str] = {}
    for key in _PARAMETERS:
        if key not in config.parameters:
            continue
        text = config.parameters[key].string_value.strip()
        try:
            value = int(text) if types[key] == "int" else float(text)
        except ValueError:
            raise ValueError(f"parameter {key} must be a number, not {text!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"parameter {key} must be positive, not {text!r}")
        changes[key] = value
    key = native_threads.PARAMETER
    if key in config.parameters:
        text = config.parameters[key].string_value.strip()
        if text not in native_threads.CHOICES:
            choices = " or ".join(native_threads.CHOICES)
            raise ValueError(f"parameter {key} must be {choices}, not {text!r}")
        changes[key] = text
    return replace(limits, **changes)  # type: ignore[arg-type]
