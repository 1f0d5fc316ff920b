"""Node-level options only the LLM runtimes take, apart from every runtime's
:class:`~runtimes.base.RuntimeOptions`; the registry's factory hands them over."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol


class SpareEngineProcesses(Protocol):
    """Engine processes started ahead of a load (the transformers runtime's
    ``SpareEngines``), declared here so that the options need not import that runtime."""

    def take(self) -> tuple[subprocess.Popen[Any], Connection] | None:
        """A started process and its connection, if one is still running."""

    def refill(self) -> None:
        """Start a process for the next load unless there is one (returns at once)."""

    def close(self) -> None:
        """Stop the spare process (blocking, bounded); later refills start none."""


@dataclass(frozen=True)
class LLMOptions:
    """Node-level knobs only the LLM runtimes take; the registry hands them over."""

    spare_engines: SpareEngineProcesses | None = None
    """The server's spare engine process (see :class:`SpareEngineProcesses`); None: none
    kept."""
