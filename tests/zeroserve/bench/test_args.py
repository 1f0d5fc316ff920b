"""The command line: durations, levels, shapes, headers and the config they build."""

from __future__ import annotations

import argparse

import pytest

from zeroserve.bench.args import (
    config_from_args,
    parse_duration,
    parse_header,
    parse_levels,
    parse_shape,
)
from zeroserve.cli import build_parser


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("10s", 10.0, id="seconds"),
        pytest.param("500ms", 0.5, id="milliseconds"),
        pytest.param("2m", 120.0, id="minutes"),
        pytest.param("1.5", 1.5, id="bare number"),
        pytest.param(" 3 s ", 3.0, id="spaces"),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten", "5h", "-1s", "1s2"])
def test_bad_durations(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_levels_and_their_errors():
    assert parse_levels("1,8, 32,64") == (1.0, 8.0, 32.0, 64.0)
    for bad in ("", "0", "1,-2", "a,b"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_levels(bad)


def test_shapes_and_headers():
    assert parse_shape("INPUT0:3,224,224") == ("INPUT0", (3, 224, 224))
    assert parse_shape("ns:name:4") == ("ns:name", (4,))
    for bad in ("INPUT0", "INPUT0:", ":4", "INPUT0:-1", "INPUT0:x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_shape(bad)
    assert parse_header("Authorization: Bearer x:y") == ("Authorization", "Bearer x:y")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_header("no colon")


def _config(*argv: str):
    args = build_parser().parse_args(["bench", "http://127.0.0.1:1", "--model", "m", *argv])
    return config_from_args(args)


def test_defaults_are_one_connection_ten_seconds():
    config = _config()
    assert (config.mode, config.levels, config.duration_s, config.warmup_s) == (
        "concurrency",
        (1.0,),
        10.0,
        2.0,
    )
    assert not config.is_binary and config.input_data == "random"


def test_request_rate_selects_the_open_loop():
    config = _config("--request-rate", "100,500", "--duration", "5s", "--binary")
    assert (config.mode, config.levels, config.duration_s, config.is_binary) == (
        "rate",
        (100.0, 500.0),
        5.0,
        True,
    )


def test_concurrency_and_rate_exclude_each_other():
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["bench", "u", "--model", "m", "--concurrency", "1", "--request-rate", "5"]
        )


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(("--concurrency", "1.5"), id="fractional concurrency"),
        pytest.param(("--openai", "--binary"), id="openai with binary"),
        pytest.param(("--batch-size", "0"), id="batch size 0"),
        pytest.param(("--duration", "0s"), id="no duration"),
        pytest.param(("--protocol", "grpc", "--openai"), id="grpc with openai"),
        pytest.param(("--protocol", "grpc", "--binary"), id="grpc with binary"),
        pytest.param(("--protocol", "grpc", "--header", "A: b"), id="grpc with a header"),
        pytest.param(("--shared-memory", "system", "--openai"), id="shared memory with openai"),
        pytest.param(("--streams-per-connection", "0"), id="no streams"),
        pytest.param(("--output-shared-memory-size", "0"), id="no output room"),
    ],
)
def test_inconsistent_options_are_refused(argv):
    with pytest.raises(ValueError):
        _config(*argv)


def test_grpc_and_shared_memory_options():
    config = _config()
    assert (config.protocol, config.shared_memory) == ("http", "none")
    config = _config(
        "-i", "grpc", "--shared-memory", "system", "--streams-per-connection", "4",
        "--output-shared-memory-size", "4096",
    )  # fmt: skip
    assert (config.protocol, config.shared_memory) == ("grpc", "system")
    assert (config.streams_per_connection, config.output_shm_bytes) == (4, 4096)
