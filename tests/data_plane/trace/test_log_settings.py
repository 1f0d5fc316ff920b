"""Triton's logging settings over Python's logging, on a logger of the test's own: each
severity on and off by itself, verbose levels, the ISO 8601 format, and the logger put back
as it was."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator

import pytest

from data_plane.log_settings import (
    LogControl,
    LogFormat,
    LogSettings,
    LogUpdate,
    parse_log_format,
)

DEFAULT_FORMAT = "%(levelname)s:%(message)s"


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("tests.log_settings")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    yield logger
    logger.handlers.clear()
    logger.setLevel(logging.NOTSET)
    logger.propagate = True


@pytest.fixture
def output(logger: logging.Logger) -> io.StringIO:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(DEFAULT_FORMAT))
    logger.addHandler(handler)
    return stream


def emit_all(logger: logging.Logger) -> None:
    logger.debug("d")
    logger.info("i")
    logger.warning("w")
    logger.error("e")


def lines(output: io.StringIO) -> list[str]:
    text = output.getvalue().splitlines()
    output.truncate(0)
    output.seek(0)
    return text


def test_settings_start_from_the_loggers_level(logger: logging.Logger):
    assert LogControl(logger).settings() == LogSettings(
        log_file="",
        log_info=True,
        log_warning=True,
        log_error=True,
        log_verbose_level=0,
        log_format=LogFormat.DEFAULT,
    )
    logger.setLevel(logging.WARNING)
    assert not LogControl(logger).settings().log_info
    logger.setLevel(logging.DEBUG)
    assert LogControl(logger).settings().log_verbose_level == 1


def test_each_severity_turns_off_by_itself(logger: logging.Logger, output: io.StringIO):
    control = LogControl(logger)
    control.update(LogUpdate(log_warning=False))
    emit_all(logger)
    assert lines(output) == ["INFO:i", "ERROR:e"]
    control.update(LogUpdate(log_info=False, log_warning=True, log_error=False))
    emit_all(logger)
    assert lines(output) == ["WARNING:w"]
    control.update(LogUpdate(log_info=True, log_error=True))
    emit_all(logger)
    assert lines(output) == ["INFO:i", "WARNING:w", "ERROR:e"]


def test_verbose_level_turns_debug_on(logger: logging.Logger, output: io.StringIO):
    control = LogControl(logger)
    assert control.update(LogUpdate(log_verbose_level=2)).log_verbose_level == 2
    emit_all(logger)
    assert lines(output) == ["DEBUG:d", "INFO:i", "WARNING:w", "ERROR:e"]
    control.update(LogUpdate(log_verbose_level=0))
    emit_all(logger)
    assert lines(output) == ["INFO:i", "WARNING:w", "ERROR:e"]


def test_verbose_level_is_kept_as_tritons_int32(logger: logging.Logger):
    control = LogControl(logger)
    assert control.update(LogUpdate(log_verbose_level=2**40)).log_verbose_level == 0
    assert control.update(LogUpdate(log_verbose_level=2**32 + 5)).log_verbose_level == 5
    assert control.update(LogUpdate(log_verbose_level=2**31)).log_verbose_level == 0
    assert control.update(LogUpdate(log_verbose_level=2**31 - 1)).log_verbose_level == 2**31 - 1


def test_iso8601_format_and_back(logger: logging.Logger, output: io.StringIO):
    control = LogControl(logger)
    control.update(LogUpdate(log_format=LogFormat.ISO8601))
    logger.warning("hello")
    (line,) = lines(output)
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ W \d+ test_log_settings\.py:\d+\] hello", line
    ), line
    control.update(LogUpdate(log_format=LogFormat.DEFAULT))
    logger.warning("again")
    assert lines(output) == ["WARNING:again"]


def test_close_puts_the_logger_back(logger: logging.Logger, output: io.StringIO):
    control = LogControl(logger)
    control.update(LogUpdate(log_info=False, log_verbose_level=1, log_format=LogFormat.ISO8601))
    control.close()
    assert logger.level == logging.INFO
    emit_all(logger)
    assert lines(output) == ["INFO:i", "WARNING:w", "ERROR:e"]
    control.close()  # idempotent


def test_nothing_changes_before_the_first_update(logger: logging.Logger, output: io.StringIO):
    control = LogControl(logger)
    control.settings()
    assert logger.handlers[0].filters == []
    control.close()
    assert logger.level == logging.INFO


@pytest.mark.parametrize(
    ("text", "expected"),
    [("default", LogFormat.DEFAULT), ("ISO8601", LogFormat.ISO8601), ("iso8601", None), ("", None)],
)
def test_formats_are_named_exactly(text, expected):
    assert parse_log_format(text) == expected
