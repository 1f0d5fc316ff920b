"""The server's trace settings, and the sampling of requests under them.

Follows Triton's ``TraceManager``: a server setting, starting from the start-up values, and
per-model settings that override it field by field. A model setting keeps the fields set for
it and takes the rest from the server's, again after each change to the server's (Triton
rebuilds them then, so their counters start again). Clearing every field of a model's
setting (``null``) drops it: the model follows the server's setting as a whole.

Everything here runs on the event loop: the inference path asks :meth:`TraceManager.sample`
at each request (only while :attr:`TraceManager.is_active`, one attribute read otherwise),
and transports read and change settings through the trace handler.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from data_plane.errors import InvalidArgumentError
from data_plane.trace.request import RequestTrace
from data_plane.trace.setting import TraceSetting
from data_plane.trace.settings import TraceConfig
from data_plane.trace.values import (
    COUNT,
    LEVEL,
    LOG_FREQUENCY,
    RATE,
    TraceLevel,
    TraceUpdate,
    TraceValues,
)
from data_plane.trace.writer import TraceFile, TraceWriter

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from data_plane.trace.otel import OtelSpans

logger = logging.getLogger(__name__)

_FIELDS = (LEVEL, RATE, COUNT, LOG_FREQUENCY)


class TraceManager:
    """Trace settings of one server, and the traces taken under them."""

    def __init__(self, config: TraceConfig, *, span_exporter: SpanExporter | None = None) -> None:
        """``span_exporter`` replaces the OTLP/HTTP exporter in trace mode ``opentelemetry``
        (the mode needs the ``otel`` extra; the settings check it is there)."""
        self._buffer_traces = config.trace_buffer_traces
        self._writer = TraceWriter(bound=config.trace_writer_queue_bound)
        self._file = TraceFile(config.trace_file, self._writer)
        self._spans: OtelSpans | None = None
        if config.trace_mode == "opentelemetry":
            # Imported here: the otel extra is optional, and only this mode needs it.
            from data_plane.trace.otel import OtelSpans

            self._spans = OtelSpans(config, self._writer, exporter=span_exporter)
        self._start = TraceValues(
            level=config.start_level,
            rate=config.trace_rate,
            count=config.trace_count,
            log_frequency=config.trace_log_frequency,
            file=config.trace_file,
        )
        self._server = self._setting(self._start, frozenset())
        self._models: dict[str, TraceSetting] = {}
        self._next_id = 1
        self.is_active = False
        """Whether any setting traces at all; False lets requests skip sampling."""
        self._refresh_active()

    @property
    def dropped_writes(self) -> int:
        """Trace writes dropped because the writer was behind."""
        return self._writer.dropped

    def settings(self, model: str | None = None) -> TraceValues:
        """The setting in force for ``model`` (its own, else the server's), or the server's."""
        setting = self._server if model is None else self._models.get(model, self._server)
        return setting.values()

    def update(self, model: str | None, update: TraceUpdate) -> TraceValues:
        """Apply ``update`` to ``model``'s setting (None: the server's) and return the
        setting now in force.

        Raises InvalidArgumentError, Triton's "Attempting to set invalid trace setting",
        when the result could trace nothing yet is not OFF (no trace file, a rate of 0, a
        count of 0). As in Triton, a server change is applied before the model settings that
        follow it are rebuilt, and one of those failing leaves the rest as they were.
        """
        if model is None:
            self._replace(None, self._rebuilt(self._server, self._start, update))
            for name in list(self._models):
                setting = self._rebuilt(self._models[name], self._server.values(), TraceUpdate())
                self._replace(name, setting)
        else:
            current = self._models.get(model)
            if _specified(current, update):
                self._replace(model, self._rebuilt(current, self._server.values(), update))
            else:
                self._replace(model, None)
        return self.settings(model)

    def sample(self, model: str) -> RequestTrace | None:
        """A trace for the request for ``model`` arriving now, if it is to be traced."""
        setting = self._models.get(model, self._server)
        if not setting.sample():
            return None
        trace = RequestTrace(self._next_id, setting)
        self._next_id += 1
        return trace

    async def close(self, *, timeout_s: float) -> None:
        """Write out every setting's traces and end the trace file, waiting up to
        ``timeout_s`` for the writes (traces finishing later are lost)."""
        for setting in (self._server, *self._models.values()):
            setting.retire()
        self._file.close()
        await self._writer.close(timeout_s=timeout_s)
        if self._spans is not None:
            await self._spans.close(timeout_s=timeout_s)

    def _rebuilt(
        self, current: TraceSetting | None, fallback: TraceValues, update: TraceUpdate
    ) -> TraceSetting:
        """``current`` with ``update`` applied, fields not set for it taken from ``fallback``."""
        given = _given(update)
        specified = _specified(current, update)

        def pick(name: str, fallback_value: int) -> int:
            if name not in specified:
                return fallback_value
            value = given[name]
            if value is not None:
                return value
            assert current is not None  # specified without a value: kept from current
            return int(getattr(current, _ATTRIBUTES[name]))

        values = TraceValues(
            level=TraceLevel(pick(LEVEL, fallback.level)),
            rate=pick(RATE, fallback.rate),
            count=pick(COUNT, fallback.count),
            log_frequency=pick(LOG_FREQUENCY, fallback.log_frequency),
            file=fallback.file,
        )
        setting = self._setting(values, specified)
        if not setting.is_valid and setting.level:
            raise InvalidArgumentError(
                f"Attempting to set invalid trace setting :{setting.invalid_reason}"
            )
        return setting

    def _setting(self, values: TraceValues, specified: frozenset[str]) -> TraceSetting:
        return TraceSetting(
            level=values.level,
            rate=values.rate,
            count=values.count,
            log_frequency=values.log_frequency,
            file=self._file,
            specified=specified,
            buffer_traces=self._buffer_traces,
            spans=self._spans,
        )

    def _replace(self, model: str | None, setting: TraceSetting | None) -> None:
        """Put ``setting`` in force (None: drop ``model``'s own) and retire the old one."""
        if model is None:
            assert setting is not None
            old: TraceSetting | None = self._server
            self._server = setting
        else:
            old = self._models.pop(model, None)
            if setting is not None:
                self._models[model] = setting
        if old is not None:
            old.retire()
        self._refresh_active()

    def _refresh_active(self) -> None:
        self.is_active = bool(self._server.level) or any(
            setting.level for setting in self._models.values()
        )


_ATTRIBUTES = {LEVEL: "level", RATE: "rate", COUNT: "count", LOG_FREQUENCY: "log_frequency"}


def _given(update: TraceUpdate) -> dict[str, int | None]:
    return {
        LEVEL: update.level,
        RATE: update.rate,
        COUNT: update.count,
        LOG_FREQUENCY: update.log_frequency,
    }


def _specified(current: TraceSetting | None, update: TraceUpdate) -> frozenset[str]:
    """The fields set for a setting after ``update``: given now, or set before and not
    cleared now."""
    given = _given(update)
    return frozenset(
        name
        for name in _FIELDS
        if name not in update.cleared
        and (given[name] is not None or (current is not None and name in current.specified))
    )
