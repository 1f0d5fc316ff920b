"""Parsing trace setting values as Triton's front ends do (``std::stoi`` and its errors),
with Triton 2.51's texts, observed on the real server."""

from __future__ import annotations

import pytest

from data_plane.errors import InvalidArgumentError
from data_plane.trace import TraceLevel, parse_count, parse_level, parse_log_frequency, parse_rate
from data_plane.trace.values import stoi


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("5", 5),
        (" 5", 5),
        ("  \t\n9", 9),
        ("5x", 5),
        ("1.5", 1),
        ("+7", 7),
        ("-0", 0),
        ("0x10", 0),
        ("-2147483648", -(2**31)),
        ("2147483647", 2**31 - 1),
    ],
)
def test_stoi_reads_a_leading_decimal_int(text: str, value: int):
    assert stoi(text) == value


@pytest.mark.parametrize("text", ["", "abc", " ", "+", "-x", "\u0662", "x5"])
def test_stoi_without_leading_digits_is_invalid(text: str):
    with pytest.raises(ValueError):
        stoi(text)


@pytest.mark.parametrize("text", ["2147483648", "-2147483649", "99999999999"])
def test_stoi_outside_int32_is_out_of_range(text: str):
    with pytest.raises(OverflowError):
        stoi(text)


def test_rate_and_log_frequency_wrap_to_unsigned_32_bits():
    assert parse_rate("-1") == 2**32 - 1
    assert parse_rate("-2147483648") == 2**31
    assert parse_log_frequency("-1") == 2**32 - 1
    assert parse_rate("1000") == 1000


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_rate, "abc", "Unable to parse 'trace_rate', got: abc"),
        (parse_rate, "", "Unable to parse 'trace_rate', got: "),
        (
            parse_rate,
            "99999999999",
            "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], "
            "got: 99999999999",
        ),
        (
            parse_rate,
            "2147483648",
            "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], "
            "got: 2147483648",
        ),
        (parse_log_frequency, "z", "Unable to parse 'log_frequency', got: z"),
        (
            parse_log_frequency,
            "99999999999",
            "Unable to parse 'log_frequency', value is out of range [ 0, 4294967295 ], "
            "got: 99999999999",
        ),
        (parse_count, "z", "Unable to parse 'trace_count', got: z"),
        (
            parse_count,
            "99999999999",
            "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], "
            "got: 99999999999",
        ),
        (parse_count, "-5", "Unable to parse 'trace_count'. Expecting value >= -1, got:-5"),
    ],
)
def test_bad_values_get_tritons_texts(parse, text, message):
    with pytest.raises(InvalidArgumentError) as caught:
        parse(text)
    assert caught.value.message == message


def test_count_below_minus_one_over_grpc_has_a_space_after_got():
    with pytest.raises(InvalidArgumentError) as caught:
        parse_count("-2", got_separator=": ")
    assert caught.value.message == "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"


def test_count_accepts_minus_one_and_c_leniency():
    assert parse_count("-1") == -1
    assert parse_count("-1.9") == -1
    assert parse_count("0") == 0


@pytest.mark.parametrize(
    ("names", "level"),
    [
        (["OFF"], TraceLevel.OFF),
        (["TIMESTAMPS"], TraceLevel.TIMESTAMPS),
        (["TENSORS"], TraceLevel.TENSORS),
        (["TIMESTAMPS", "TENSORS"], TraceLevel.TIMESTAMPS | TraceLevel.TENSORS),
        (["TIMESTAMPS", "BOGUS"], TraceLevel.TIMESTAMPS),
        (["BOGUS"], None),
        ([], None),
    ],
)
def test_levels_unknown_names_are_skipped(names, level):
    assert parse_level(names) == level


@pytest.mark.parametrize("names", [["OFF", "TIMESTAMPS"], ["TIMESTAMPS", "OFF"], ["OFF", "OFF"]])
def test_off_must_stand_alone(names):
    with pytest.raises(InvalidArgumentError) as caught:
        parse_level(names)
    assert caught.value.message == "Expect only one trace level 'OFF' is specified"


def test_level_names_in_tritons_order():
    assert TraceLevel.OFF.names == ("OFF",)
    assert (TraceLevel.TENSORS | TraceLevel.TIMESTAMPS).names == ("TIMESTAMPS", "TENSORS")
