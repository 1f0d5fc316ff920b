"""What a command prints: one convention for every ``zeroserve`` command that shows results.

``-o table`` (the default) prints a table for people, with times as ages ("3m ago"),
durations as "1.2 s" and sizes as "1.4 GiB"; ``-o json`` and ``-o yaml`` print the document
as the admin API returned it, every field, for scripts. A command makes one call::

    emit(doc, MODEL_COLUMNS, args.output, items="models")

A list (or ``doc[items]``) becomes one row per item; a single object becomes one line per
column (``FIELD  value``). Columns name a field by dotted path (``"status.state"``) or by a
function of the item, and say how its value reads (:class:`Column`).

It lives at the bottom of the import layers because the admin client that prints
``zeroserve models`` and ``zeroserve keys`` results is in the control plane, which may not
import the command line above it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TextIO

__all__ = [
    "FORMATS",
    "Column",
    "add_output_option",
    "emit",
    "human_age",
    "human_bytes",
    "human_duration",
]

FORMATS = ("table", "json", "yaml")
"""The values of ``-o``/``--output``."""

Kind = Literal["text", "age", "duration", "bytes", "count"]

_MISSING = "-"


@dataclass(frozen=True)
class Column:
    """One column of a table (or one line of a single object's listing).

    Parameters:
        header: what the column is called (upper case by convention: ``IN_FLIGHT``).
        field: a dotted path into the item (``"scaling.min_replicas"``), or a function of
            the item returning the value.
        kind: how the value reads: ``text`` (as is; a list joined with commas), ``age``
            (epoch seconds, shown as "3m ago"), ``duration`` (seconds, shown as "1.2 s"),
            ``bytes`` (shown as "1.4 GiB") or ``count`` (the length of a list).
    """

    header: str
    field: str | Callable[[Any], Any]
    kind: Kind = "text"

    def value(self, item: Any) -> Any:
        """The raw value of this column for ``item`` (None when a path is absent)."""
        if callable(self.field):
            return self.field(item)
        value = item
        for part in self.field.split("."):
            if not isinstance(value, Mapping) or part not in value:
                return None
            value = value[part]
        return value

    def cell(self, item: Any, now: float) -> str:
        """The value of this column for ``item``, as the table shows it."""
        return _format(self.value(item), self.kind, now)


def add_output_option(parser: argparse.ArgumentParser, *, default: str | None = "table") -> None:
    """Adds ``-o/--output {table,json,yaml}`` to ``parser``.

    ``default=argparse.SUPPRESS`` on a subcommand lets the option be given either before or
    after the subcommand without the subcommand's default overwriting the parent's value.
    """
    parser.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default=default,
        help="how to print results: table (for people, the default), or json or yaml (every "
        "field the admin API returns, for scripts)",
    )


def emit(
    doc: Any,
    columns: Sequence[Column],
    fmt: str,
    *,
    items: str | None = None,
    out: TextIO | None = None,
    now: float | None = None,
) -> None:
    """Prints ``doc`` in format ``fmt`` (one of :data:`FORMATS`) to ``out`` (stdout).

    json and yaml print ``doc`` whole. A table shows ``columns`` of ``doc[items]`` when
    ``items`` is given, of each element when ``doc`` is a list, and of ``doc`` itself, one
    line per column, otherwise. ``now`` (epoch seconds) is what ages count from.
    """
    stream = sys.stdout if out is None else out
    if fmt == "json":
        print(json.dumps(doc, indent=2), file=stream)
    elif fmt == "yaml":
        # Imported here: only ``-o yaml`` needs it.
        import yaml

        stream.write(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    elif fmt == "table":
        clock = time.time() if now is None else now
        rows = doc[items] if items is not None else doc
        if isinstance(rows, Sequence) and not isinstance(rows, str | bytes):
            _print_rows(rows, columns, clock, stream)
        else:
            _print_fields(rows, columns, clock, stream)
    else:
        raise ValueError(f"unknown output format {fmt!r}; one of {', '.join(FORMATS)}")


def _print_rows(rows: Sequence[Any], columns: Sequence[Column], now: float, out: TextIO) -> None:
    table = [[column.header for column in columns]]
    table += [[column.cell(row, now) for column in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=out)


def _print_fields(item: Any, columns: Sequence[Column], now: float, out: TextIO) -> None:
    width = max((len(column.header) for column in columns), default=0)
    for column in columns:
        print(f"{column.header.ljust(width)}  {column.cell(item, now)}".rstrip(), file=out)


def _format(value: Any, kind: Kind, now: float) -> str:
    if kind == "count":
        return str(len(value)) if isinstance(value, Sequence) else _MISSING
    if value is None or value == "":
        return _MISSING
    if kind == "age" and isinstance(value, int | float):
        return human_age(float(value), now)
    if kind == "duration" and isinstance(value, int | float):
        return human_duration(float(value))
    if kind == "bytes" and isinstance(value, int | float):
        return human_bytes(int(value))
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(_format(v, "text", now) for v in value) or _MISSING
    if isinstance(value, Mapping):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def human_duration(seconds: float) -> str:
    """``seconds`` as people read them: "850 ms", "1.2 s", "42 s", "3m 05s", "2h 03m"."""
    if not math.isfinite(seconds):
        return str(seconds)
    if seconds < 0:
        return "-" + human_duration(-seconds)
    if seconds < 1:
        millis = seconds * 1000
        return f"{millis:.0f} ms" if millis >= 1 else f"{millis:.2g} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600:02d}h"


def human_age(at: float, now: float) -> str:
    """The wall-clock time ``at`` (epoch seconds) seen from ``now``: "3m ago", "in 5 s"."""
    delta = now - at
    if abs(delta) < 1:
        return "just now"
    span = _coarse(abs(delta))
    return f"{span} ago" if delta > 0 else f"in {span}"


def _coarse(seconds: float) -> str:
    # An age is read at a glance: its largest unit is enough.
    whole = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def human_bytes(size: int) -> str:
    """``size`` in binary units: "512 B", "1.4 KiB", "3.6 GiB"."""
    if size < 1024:
        return f"{size} B"
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    exponent = min(int(math.log(size, 1024)), len(units) - 1)
    value = size / 1024**exponent
    if value >= 1023.5 and exponent < len(units) - 1:  # 1023.7 KiB would read "1024 KiB"
        exponent += 1
        value /= 1024
    return f"{value:.1f} {units[exponent]}" if value < 100 else f"{value:.0f} {units[exponent]}"
