"""What a generation asks for and what it gives back, engine-independent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from runtimes.errors import InvalidParameterError

FinishReason = Literal["stop", "length", "abort"]
"""Why a generation ended: an end-of-sequence token or stop string, ``max_tokens``, or an
abort (client gone, sleep, shutdown)."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick the next tokens of one sequence (OpenAI's names and defaults)."""

    max_tokens: int | None = None
    """Completion tokens at most; None: as many as the context window leaves."""
    temperature: float = 1.0
    """0 decodes greedily (deterministic); otherwise the softmax temperature."""
    top_p: float = 1.0
    """Nucleus sampling: sample among the smallest token set holding this probability."""
    stop: tuple[str, ...] = ()
    """Strings that end the completion; the text returned stops before them."""
    seed: int | None = None
    """Seed for sampling, where the engine can seed one request (vLLM); see README."""

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class Delta:
    """What one step of a generation added."""

    text: str
    """New text, ready to show (stop strings and incomplete characters held back)."""
    tokens: int
    """Completion tokens this step added (a delta may carry tokens and no text yet)."""
    finish_reason: FinishReason | None = None
    """Set on the last delta only."""


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """Requests inside the engine now."""

    running: int
    """Being decoded (they hold KV cache)."""
    waiting: int
    """Admitted but not scheduled yet."""


_MAX_STOP_STRINGS = 4
"""OpenAI's limit on ``stop`` strings."""


def sampling_from_mapping(
    doc: Mapping[str, Any], *, default_max_tokens: int | None, prefix: str = ""
) -> SamplingParams:
    """The sampling parameters in ``doc`` (``max_tokens``, ``temperature``, ``top_p``,
    ``stop``, ``seed``); absent keys take OpenAI's defaults, other keys are ignored.

    ``default_max_tokens`` None means "as many as the context allows" (the engine works it
    out from the prompt). Raises InvalidParameterError naming the parameter (with
    ``prefix`` before it) for wrong types and values out of range.
    """
    max_tokens = _number(doc, "max_tokens", int, prefix, default=default_max_tokens, low=1)
    temperature = _number(doc, "temperature", float, prefix, default=1.0, low=0.0, high=2.0)
    top_p = _number(doc, "top_p", float, prefix, default=1.0, low=0.0, high=1.0)
    if top_p == 0.0:
        raise InvalidParameterError(f"{prefix}top_p must be in (0, 1], got 0", param="top_p")
    seed = _number(doc, "seed", int, prefix, default=None)
    stop = _stop(doc.get("stop"), prefix)
    return SamplingParams(
        max_tokens=None if max_tokens is None else int(max_tokens),
        temperature=float(temperature if temperature is not None else 1.0),
        top_p=float(top_p if top_p is not None else 1.0),
        stop=stop,
        seed=None if seed is None else int(seed),
    )


def _number(
    doc: Mapping[str, Any],
    key: str,
    kind: type[int] | type[float],
    prefix: str,
    *,
    default: float | None,
    low: float | None = None,
    high: float | None = None,
) -> float | None:
    value = doc.get(key)
    if value is None:
        return default
    # bool is an int in Python but never a number in JSON.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParameterError(
            f"{prefix}{key} must be a number, got {type(value).__name__}", param=key
        )
    if kind is int and not float(value).is_integer():
        raise InvalidParameterError(f"{prefix}{key} must be an integer, got {value}", param=key)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        raise InvalidParameterError(f"{prefix}{key} must be in {bounds}, got {value}", param=key)
    return value


def _stop(value: Any, prefix: str) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidParameterError(
            f"{prefix}stop must be a string or a list of strings", param="stop"
        )
    if len(stops) > _MAX_STOP_STRINGS:
        raise InvalidParameterError(
            f"{prefix}stop takes at most {_MAX_STOP_STRINGS} strings, got {len(stops)}",
            param="stop",
        )
    return tuple(s for s in stops if s)
