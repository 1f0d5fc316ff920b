"""The vocabulary of Triton's trace settings: levels, the values a setting holds, a requested
change, and the parsing of each value from the text a client sends, with Triton's texts.

Transports share these: the HTTP route and the gRPC service both receive the values as text
(JSON strings, ``SettingValue.value`` strings) and Triton parses them with ``std::stoi``,
whose leniency (leading blanks, a trailing remainder ignored) and range errors are kept.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from data_plane.errors import InvalidArgumentError

UINT32_MAX: Final = 2**32 - 1
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
MIN_TRACE_COUNT: Final = -1
"""``trace_count`` -1 traces without bound."""

RATE: Final = "trace_rate"
COUNT: Final = "trace_count"
LEVEL: Final = "trace_level"
LOG_FREQUENCY: Final = "log_frequency"
FILE: Final = "trace_file"
MODE: Final = "trace_mode"

_C_SPACES: Final = " \t\n\v\f\r"
_DIGITS: Final = "0123456789"


class TraceLevel(enum.IntFlag):
    """What a trace records: nothing (``OFF``), timestamps, tensors, or both."""

    OFF = 0
    TIMESTAMPS = 1
    TENSORS = 2

    @property
    def names(self) -> tuple[str, ...]:
        """Triton's list for this level: ``["OFF"]``, or each level it has, in Triton's order."""
        if not self:
            return ("OFF",)
        named = (("TIMESTAMPS", TraceLevel.TIMESTAMPS), ("TENSORS", TraceLevel.TENSORS))
        return tuple(name for name, level in named if level & self)


@dataclass(frozen=True, slots=True)
class TraceValues:
    """One trace setting as clients read it (``GET .../trace/setting``)."""

    level: TraceLevel
    rate: int
    """Every ``rate``-th request is traced; 0 traces none."""
    count: int
    """Traces still to take under this setting; -1 has no bound."""
    log_frequency: int
    """Traces per file ``<trace_file>.<n>``; 0 writes them to ``trace_file`` itself."""
    file: str
    mode: str = "triton"


@dataclass(frozen=True, slots=True)
class TraceUpdate:
    """A change to a trace setting: the fields given (None: left as they are) and the fields
    cleared (``null`` in JSON, no values in gRPC), which fall back to the server's setting
    (for a model) or to the start-up setting (for the server)."""

    level: TraceLevel | None = None
    rate: int | None = None
    count: int | None = None
    log_frequency: int | None = None
    cleared: frozenset[str] = field(default_factory=frozenset)
    """Names among ``trace_level``, ``trace_rate``, ``trace_count``, ``log_frequency``."""


def parse_level(names: Sequence[str]) -> TraceLevel | None:
    """The level a list of level names asks for, as Triton reads it: unknown names are
    skipped, so a list of only unknown names (or none) changes nothing (None); ``OFF``
    must stand alone."""
    level: TraceLevel | None = None
    for name in names:
        if name == "OFF":
            if len(names) != 1:
                raise InvalidArgumentError("Expect only one trace level 'OFF' is specified")
            level = TraceLevel.OFF
        elif name == "TIMESTAMPS":
            level = (level or TraceLevel.OFF) | TraceLevel.TIMESTAMPS
        elif name == "TENSORS":
            level = (level or TraceLevel.OFF) | TraceLevel.TENSORS
    return level


def parse_rate(text: str) -> int:
    """``trace_rate``: parsed as a C ``int``, then taken as unsigned 32 bits (so "-1" is
    4294967295, as in Triton)."""
    return _parse_int(RATE, text, f"[ 0, {UINT32_MAX} ]") & UINT32_MAX


def parse_log_frequency(text: str) -> int:
    """``log_frequency``: parsed like ``trace_rate``."""
    return _parse_int(LOG_FREQUENCY, text, f"[ 0, {UINT32_MAX} ]") & UINT32_MAX


def parse_count(text: str, *, got_separator: str = ":") -> int:
    """``trace_count``: a C ``int`` of at least -1. Triton's HTTP text for a smaller value
    reads ``got:-2``, its gRPC text ``got: -2`` (``got_separator=": "``)."""
    count = _parse_int(COUNT, text, f"[ {MIN_TRACE_COUNT}, {INT32_MAX} ]")
    if count < MIN_TRACE_COUNT:
        raise InvalidArgumentError(
            f"Unable to parse '{COUNT}'. Expecting value >= {MIN_TRACE_COUNT}, "
            f"got{got_separator}{text}"
        )
    return count


def stoi(text: str) -> int:
    """C++ ``std::stoi``: blanks, a sign and decimal digits, the rest ignored.

    Raises ValueError when no digits lead (``std::invalid_argument``) and OverflowError
    outside a 32-bit ``int`` (``std::out_of_range``).
    """
    start = 0
    while start < len(text) and text[start] in _C_SPACES:
        start += 1
    end = start
    if end < len(text) and text[end] in "+-":
        end += 1
    digits_start = end
    while end < len(text) and text[end] in _DIGITS:
        end += 1
    if end == digits_start:
        raise ValueError(text)
    value = int(text[start:end])
    if not INT32_MIN <= value <= INT32_MAX:
        raise OverflowError(text)
    return value


def _parse_int(name: str, text: str, bounds: str) -> int:
    try:
        return stoi(text)
    except ValueError:
        raise InvalidArgumentError(f"Unable to parse '{name}', got: {text}") from None
    except OverflowError:
        raise InvalidArgumentError(
            f"Unable to parse '{name}', value is out of range {bounds}, got: {text}"
        ) from None
