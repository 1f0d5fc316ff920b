"""Triton's logging settings (``/v2/logging``, ``LogSettings``) over Python's logging.

What each setting does here, for the process's root logger and the handlers it has:

* ``log_info``, ``log_warning``, ``log_error`` turn each severity on or off on its own
  (CRITICAL counts as error), through a filter on the handlers, with the logger's level
  lowered to the lowest severity on;
* ``log_verbose_level`` above 0 turns DEBUG records on (Python has one verbose level);
* ``log_format`` ``ISO8601`` writes Triton's ISO 8601 layout
  (``2024-11-24T09:56:41Z I 4899 server.py:12] message``, UTC); ``default`` puts back the
  handlers' own formatters, zeroserve's default layout rather than Triton's;
* ``log_file`` is read only, as in Triton: zeroserve logs to standard error, so it is "".

Nothing changes until the first update, and :meth:`LogControl.close` puts the logger back
as it found it. Python's logging is process-wide, so in ``zeroserve up`` (one process for
every component) the settings apply to all of them, as Triton's apply to its whole process.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from typing import Final

_INT32: Final = 2**32


class LogFormat(enum.StrEnum):
    """Triton's log formats."""

    DEFAULT = "default"
    ISO8601 = "ISO8601"


@dataclass(frozen=True, slots=True)
class LogSettings:
    """The logging settings as clients read them."""

    log_file: str
    log_info: bool
    log_warning: bool
    log_error: bool
    log_verbose_level: int
    """As Triton keeps it: the level asked for, cast to a C int32, negative ones as 0."""
    log_format: LogFormat


@dataclass(frozen=True, slots=True)
class LogUpdate:
    """A change to the logging settings; None leaves a setting as it is."""

    log_info: bool | None = None
    log_warning: bool | None = None
    log_error: bool | None = None
    log_verbose_level: int | None = None
    log_format: LogFormat | None = None


def parse_log_format(text: str) -> LogFormat | None:
    """The format ``text`` names exactly (Triton is case sensitive), else None."""
    return next((f for f in LogFormat if f.value == text), None)


class LogControl:
    """Reads and changes the logging of ``logger`` (the root logger by default)."""

    def __init__(self, logger: logging.Logger | None = None, *, log_file: str = "") -> None:
        self._logger = logger or logging.getLogger()
        self._log_file = log_file
        level = self._logger.getEffectiveLevel()
        self._info = level <= logging.INFO
        self._warning = level <= logging.WARNING
        self._error = level <= logging.ERROR
        self._verbose_level = 1 if level <= logging.DEBUG else 0
        self._format = LogFormat.DEFAULT
        self._filter = _SeverityFilter(self)
        self._iso8601 = _Iso8601Formatter()
        # What the first update changes, kept to put back on close; None until then.
        self._original_level: int | None = None
        self._original_formatters: dict[logging.Handler, logging.Formatter | None] = {}

    def settings(self) -> LogSettings:
        return LogSettings(
            log_file=self._log_file,
            log_info=self._info,
            log_warning=self._warning,
            log_error=self._error,
            log_verbose_level=self._verbose_level,
            log_format=self._format,
        )

    def update(self, update: LogUpdate) -> LogSettings:
        """Apply every setting ``update`` gives and return the settings now in force."""
        self._install()
        if update.log_info is not None:
            self._info = update.log_info
        if update.log_warning is not None:
            self._warning = update.log_warning
        if update.log_error is not None:
            self._error = update.log_error
        if update.log_verbose_level is not None:
            # Triton casts the level to a C int32 (larger values wrap) and keeps a negative
            # one as 0.
            wrapped = update.log_verbose_level % _INT32
            self._verbose_level = wrapped if wrapped < _INT32 // 2 else 0
        if update.log_format is not None:
            self._format = update.log_format
            for handler, formatter in self._original_formatters.items():
                handler.setFormatter(
                    self._iso8601 if update.log_format is LogFormat.ISO8601 else formatter
                )
        self._logger.setLevel(self._lowest_level())
        return self.settings()

    def allows(self, levelno: int) -> bool:
        """Whether a record of ``levelno`` passes the severities turned on."""
        if levelno >= logging.ERROR:
            return self._error
        if levelno >= logging.WARNING:
            return self._warning
        if levelno >= logging.INFO:
            return self._info
        return self._verbose_level > 0

    def close(self) -> None:
        """Put the logger and its handlers back as they were before the first update."""
        if self._original_level is None:
            return
        self._logger.setLevel(self._original_level)
        for handler, formatter in self._original_formatters.items():
            handler.removeFilter(self._filter)
            handler.setFormatter(formatter)
        self._original_level = None
        self._original_formatters = {}

    def _install(self) -> None:
        if self._original_level is not None:
            return
        self._original_level = self._logger.level
        for handler in self._logger.handlers:
            self._original_formatters[handler] = handler.formatter
            handler.addFilter(self._filter)

    def _lowest_level(self) -> int:
        if self._verbose_level > 0:
            return logging.DEBUG
        for on, level in (
            (self._info, logging.INFO),
            (self._warning, logging.WARNING),
            (self._error, logging.ERROR),
        ):
            if on:
                return level
        return logging.CRITICAL + 1


class _SeverityFilter(logging.Filter):
    def __init__(self, control: LogControl) -> None:
        super().__init__()
        self._control = control

    def filter(self, record: logging.LogRecord) -> bool:
        return self._control.allows(record.levelno)


class _Iso8601Formatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s %(levelname).1s %(process)d %(filename)s:%(lineno)d] %(message)s"
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
