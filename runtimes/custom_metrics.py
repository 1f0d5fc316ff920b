"""Metrics that models define (Triton's Python-backend ``pb_utils.MetricFamily``), kept for
the server's ``/metrics``.

A model creates families (a name, a description, a kind: counter, gauge or histogram) and,
in a family, metrics (one label set each; a histogram's with its bucket bounds), then
increments, sets, observes and reads them. Handles stand for what a model created: two
handles for the same family name or the same label set share one series, as Triton's do,
and the series goes when its last handle is deleted (or its owner, a model instance,
goes away). Checks and their texts are Triton 2.51's (``TRITONSERVER_MetricNew`` and
friends), so a model reads the same errors on both servers.

Thread-safe: in-process models call from their executor threads, stubs' messages arrive
on the event loop, and scrapes render from the loop.
"""

from __future__ import annotations

import enum
import itertools
import math
import re
import threading
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from runtimes.errors import InvalidArgumentError

_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class MetricKind(enum.IntEnum):
    """Triton's ``MetricKind`` values (``pb_utils.MetricFamily.COUNTER`` is 0)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    @property
    def triton_name(self) -> str:
        return f"TRITONSERVER_METRIC_KIND_{self.name}"


class MetricError(InvalidArgumentError):
    """A metric operation Triton refuses; the message is Triton's core text."""


LabelKey = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class _Series:
    labels: LabelKey
    buckets: tuple[float, ...] = ()
    value: float = 0.0
    count: int = 0
    counts: list[int] = field(default_factory=list)
    handles: int = 0


@dataclass(slots=True)
class _Family:
    name: str
    description: str
    kind: MetricKind
    series: dict[LabelKey, _Series] = field(default_factory=dict)
    handles: int = 0


@dataclass(frozen=True, slots=True)
class _Handle:
    owner: int
    family: str
    labels: LabelKey | None
    """None for a family handle."""


class CustomMetrics:
    """Every model-defined metric family of one server; :meth:`lines` renders them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self._handles: dict[int, _Handle] = {}
        self._ids = itertools.count(1)

    def new_owner(self) -> int:
        """A token for one model instance: :meth:`drop_owner` deletes all it created."""
        with self._lock:
            return next(self._ids)

    def create_family(self, owner: int, name: str, description: str, kind: int) -> int:
        """A handle on family ``name`` (created unless it exists with the same kind)."""
        try:
            metric_kind = MetricKind(kind)
        except ValueError:
            raise MetricError(f"Unknown metric kind {kind}") from None
        if not _NAME.fullmatch(name):
            raise MetricError("Invalid metric name")
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = _Family(name, description, metric_kind)
            elif family.kind is not metric_kind:
                raise MetricError("Family name already exists with different type")
            family.handles += 1
            return self._new_handle(_Handle(owner, name, None))

    def create_metric(
        self,
        owner: int,
        family: int,
        labels: Mapping[str, object],
        buckets: Sequence[float] | None = None,
    ) -> int:
        """A handle on the series of ``labels`` in the family of handle ``family``."""
        key: list[tuple[str, str]] = []
        for name, value in labels.items():
            if not isinstance(value, str):
                raise MetricError("attempt to access JSON non-string as string")
            if not _LABEL.fullmatch(name) or name.startswith("__"):
                raise MetricError("Invalid label name")
            key.append((name, value))
        label_key = tuple(sorted(key))
        with self._lock:
            found = self._family_of(family)
            if found.kind is MetricKind.HISTOGRAM:
                bounds = tuple(float(b) for b in buckets or ())
                if any(b >= c for b, c in itertools.pairwise(bounds)):
                    raise MetricError("Bucket Boundaries must be strictly sorted")
            else:
                bounds = ()
            series = found.series.get(label_key)
            if series is None:
                series = found.series[label_key] = _Series(
                    label_key, bounds, counts=[0] * len(bounds)
                )
            series.handles += 1
            return self._new_handle(_Handle(owner, found.name, label_key))

    def increment(self, metric: int, value: float) -> None:
        with self._lock:
            family, series = self._series_of(metric)
            if family.kind is MetricKind.HISTOGRAM:
                raise MetricError(f"{family.kind.triton_name} does not support Increment")
            if family.kind is MetricKind.COUNTER and value < 0:
                raise MetricError(
                    f"{family.kind.triton_name} can only be incremented monotonically by "
                    "non-negative values."
                )
            series.value += value

    def set(self, metric: int, value: float) -> None:
        with self._lock:
            family, series = self._series_of(metric)
            if family.kind is not MetricKind.GAUGE:
                raise MetricError(f"{family.kind.triton_name} does not support Set")
            series.value = value

    def observe(self, metric: int, value: float) -> None:
        with self._lock:
            family, series = self._series_of(metric)
            if family.kind is not MetricKind.HISTOGRAM:
                raise MetricError(f"{family.kind.triton_name} does not support Observe")
            series.value += value
            series.count += 1
            index = bisect_left(series.buckets, value)
            if index < len(series.counts):
                series.counts[index] += 1

    def value(self, metric: int) -> float:
        with self._lock:
            family, series = self._series_of(metric)
            if family.kind is MetricKind.HISTOGRAM:
                raise MetricError(f"{family.kind.triton_name} does not support Value")
            return series.value

    def delete(self, handle: int) -> None:
        """Forget a family or metric handle; a series or family goes with its last one.
        Unknown handles are ignored (a model's objects may outlive their owner)."""
        with self._lock:
            self._delete(handle)

    def drop_owner(self, owner: int) -> None:
        """Delete every handle ``owner`` still holds (its instance went away)."""
        with self._lock:
            mine = [h for h, found in self._handles.items() if found.owner == owner]
            # Metrics first: a family outlives the series created in it.
            mine.sort(key=lambda h: self._handles[h].labels is None)
            for handle in mine:
                self._delete(handle)

    def lines(self) -> Iterator[str]:
        """Every family in Prometheus text, as Triton renders it (labels sorted; a
        histogram's ``_count``, ``_sum`` and cumulative ``_bucket`` lines)."""
        with self._lock:
            families = [
                (f.name, f.description, f.kind, [_snapshot(s) for s in f.series.values()])
                for f in self._families.values()
            ]
        for name, description, kind, series in families:
            yield f"# HELP {name} {description}"
            yield f"# TYPE {name} {kind.name.lower()}"
            for labels, buckets, value, count, counts in series:
                if kind is not MetricKind.HISTOGRAM:
                    yield f"{name}{_render_labels(labels)} {format_value(value)}"
                    continue
                yield f"{name}_count{_render_labels(labels)} {count}"
                yield f"{name}_sum{_render_labels(labels)} {format_value(value)}"
                running = 0
                for bound, hits in zip(buckets, counts, strict=True):
                    running += hits
                    le = (*labels, ("le", format_value(bound)))
                    yield f"{name}_bucket{_render_labels(le)} {running}"
                yield f"{name}_bucket{_render_labels((*labels, ('le', '+Inf')))} {count}"

    # ---- under the lock ----

    def _new_handle(self, handle: _Handle) -> int:
        number = next(self._ids)
        self._handles[number] = handle
        return number

    def _family_of(self, handle: int) -> _Family:
        found = self._handles.get(handle)
        family = self._families.get(found.family) if found is not None else None
        if found is None or found.labels is not None or family is None:
            raise MetricError("Invalid metric operation as the 'MetricFamily' has been deleted.")
        return family

    def _series_of(self, handle: int) -> tuple[_Family, _Series]:
        found = self._handles.get(handle)
        family = self._families.get(found.family) if found is not None else None
        series = (
            family.series.get(found.labels)
            if family is not None and found is not None and found.labels is not None
            else None
        )
        if family is None or series is None:
            raise MetricError(
                "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
            )
        return family, series

    def _delete(self, handle: int) -> None:
        found = self._handles.pop(handle, None)
        if found is None:
            return
        family = self._families.get(found.family)
        if family is None:
            return
        if found.labels is None:
            family.handles -= 1
            if family.handles <= 0:
                del self._families[found.family]
            return
        series = family.series.get(found.labels)
        if series is not None:
            series.handles -= 1
            if series.handles <= 0:
                del family.series[found.labels]


def _snapshot(
    series: _Series,
) -> tuple[LabelKey, tuple[float, ...], float, int, list[int]]:
    return series.labels, series.buckets, series.value, series.count, list(series.counts)


def format_value(value: float) -> str:
    """A sample value as Triton's exposition writes it: integers without a fraction,
    others at full precision, ``+Inf``/``-Inf``/``NaN`` spelled as Prometheus does."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _render_labels(labels: Sequence[tuple[str, str]]) -> str:
    if not labels:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def run_operation(
    metrics: CustomMetrics, owner: int, operation: str, arguments: Mapping[str, object]
) -> float:
    """Apply one operation of a model's metric objects (``family``, ``metric``,
    ``increment``, ``set``, ``observe``, ``value``, or ``delete`` of a list of ``handles``)
    as ``owner``; returns the new handle or the value read (0 for the others). MetricError
    when refused."""
    handle = arguments.get("handle")
    value = arguments.get("value")
    if operation == "delete":
        handles = arguments.get("handles")
        for found in handles if isinstance(handles, list) else ():
            metrics.delete(int(found))
        return 0.0
    if operation == "family":
        return metrics.create_family(
            owner,
            str(arguments["name"]),
            str(arguments["description"]),
            int(arguments["kind"]),  # type: ignore[call-overload]
        )
    if operation == "metric":
        labels = arguments.get("labels") or {}
        buckets = arguments.get("buckets")
        if not isinstance(labels, Mapping) or not (buckets is None or isinstance(buckets, list)):
            raise MetricError("malformed metric request")
        return metrics.create_metric(
            owner,
            int(arguments["family"]),  # type: ignore[call-overload]
            {str(k): v for k, v in labels.items()},
            buckets,
        )
    if not isinstance(handle, int):
        raise MetricError("malformed metric request: no handle")
    if operation == "value":
        return metrics.value(handle)
    if not isinstance(value, int | float):
        raise MetricError("malformed metric request: no value")
    if operation == "increment":
        metrics.increment(handle, float(value))
    elif operation == "set":
        metrics.set(handle, float(value))
    elif operation == "observe":
        metrics.observe(handle, float(value))
    else:
        raise MetricError(f"unknown metric operation {operation!r}")
    return 0.0
