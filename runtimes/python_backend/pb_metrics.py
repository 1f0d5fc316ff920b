"""``triton_python_backend_utils.MetricFamily`` and ``Metric``: custom metrics a model
defines, kept by the server and shown on its ``/metrics``.

As in Triton's Python backend (r24.10): ``MetricFamily(name, description, kind)`` with
``MetricFamily.COUNTER``, ``GAUGE`` or ``HISTOGRAM``; ``family.Metric(labels={...})``
(a histogram's with ``buckets=[...]``); ``increment``, ``set``, ``observe`` and
``value`` on a metric. Each operation is a question to the server, answered before it
returns, so ``value()`` sees every earlier change. A metric or family deleted by Python
(garbage collected) is deleted on the server too; a series stays while any metric
object for its label set lives. Refusals are ``TritonModelException`` with Triton's texts.

Standard library only: the stub imports this in a model's own environment.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable
from typing import Any, Final, Protocol

from runtimes.python_backend.pb_errors import TritonModelException


class MetricHost(Protocol):
    """What metric objects ask of the stub's host (pb_utils' ``Host`` is one)."""

    def metric_call(self, operation: str, arguments: dict[str, Any]) -> float:
        """Run ``operation`` on the server and return its number (a new handle, or a
        value); TritonModelException with the server's text when refused."""
        ...

    def metric_delete(self, handle: int) -> None:
        """A handle is gone. Called from ``__del__``, so at any allocation of any thread,
        maybe inside the host's own locks: it only notes the handle, which goes to the
        server with the next operation or message."""
        ...


class MetricKind(enum.IntEnum):
    """The kind of a family (Triton's ``pb_utils.MetricKind``)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


HostLookup = Callable[[], MetricHost | None]


def _host_of(lookup: HostLookup, prefix: str) -> MetricHost:
    host = lookup()
    if host is None:
        raise TritonModelException(f"{prefix}: metrics are only available inside a model")
    return host


def _call(host: MetricHost, prefix: str, operation: str, arguments: dict[str, Any]) -> float:
    try:
        return host.metric_call(operation, arguments)
    except TritonModelException as exc:
        raise TritonModelException(f"{prefix}: {exc}") from None


class _Lookup:
    # Set by pb_utils, which owns the host binding; a class attribute, not a global.
    host: HostLookup = staticmethod(lambda: None)


def use_host_lookup(lookup: HostLookup) -> None:
    """Where metric objects find their host (pb_utils calls this once at import)."""
    _Lookup.host = lookup


class Metric:
    """One series of a family (one label set); made by :meth:`MetricFamily.Metric`."""

    def __init__(self, host: MetricHost, handle: int) -> None:
        self._host = host
        self._handle = handle

    def increment(self, value: float) -> None:
        _call(
            self._host,
            "Failed to increment metric value",
            "increment",
            {"handle": self._handle, "value": float(value)},
        )

    def set(self, value: float) -> None:
        _call(
            self._host,
            "Failed to set metric value",
            "set",
            {"handle": self._handle, "value": float(value)},
        )

    def observe(self, value: float) -> None:
        _call(
            self._host,
            "Failed to observe metric value",
            "observe",
            {"handle": self._handle, "value": float(value)},
        )

    def value(self) -> float:
        return float(
            _call(self._host, "Failed to get metric value", "value", {"handle": self._handle})
        )

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._host.metric_delete(self._handle)


class MetricFamily:
    """A named family of metrics of one kind."""

    COUNTER: Final = MetricKind.COUNTER
    GAUGE: Final = MetricKind.GAUGE
    HISTOGRAM: Final = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self._handle: int | None = None
        if not isinstance(kind, MetricKind):
            raise TypeError(
                "__init__(): incompatible constructor arguments. The following argument "
                "types are supported:\n    1. MetricFamily(name: str, description: str, "
                f"kind: MetricKind)\n\nInvoked with: kind={kind!r}"
            )
        prefix = "Error when creating MetricFamily"
        self._host = _host_of(_Lookup.host, prefix)
        self._kind = kind
        arguments = {"name": str(name), "description": str(description), "kind": int(kind)}
        self._handle = int(_call(self._host, prefix, "family", arguments))

    def Metric(  # Triton's name for the factory
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        if labels is None:
            labels = {}
        if not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if self._kind is MetricKind.HISTOGRAM:
            if buckets is None:
                raise TritonModelException("Failed to create metric. Missing required buckets.")
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
        elif buckets is not None:
            raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        arguments = {
            "family": self._handle,
            "labels": labels,
            "buckets": [float(b) for b in buckets] if buckets is not None else None,
        }
        handle = _call(self._host, "Error when creating Metric", "metric", arguments)
        return Metric(self._host, int(handle))

    def __del__(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(Exception):
                self._host.metric_delete(self._handle)
