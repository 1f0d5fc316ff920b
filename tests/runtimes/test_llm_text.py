"""Incremental detokenization, stop strings, sampling parameters and engine parameters:
the engine-independent pieces of the LLM runtimes."""

from __future__ import annotations

from typing import Any

import pytest

from foundation.proto.model_config_pb2 import ModelConfig
from runtimes.errors import InvalidParameterError
from runtimes.llm.parameters import COMMON, ParameterError, read_parameters
from runtimes.llm.text import IncrementalDetokenizer, StopStrings
from runtimes.sampling import SamplingParams, sampling_from_mapping


class _ByteTokenizer:
    """Each token is one UTF-8 byte; a split character decodes to U+FFFD, as in HF."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def test_detokenizer_holds_split_characters_back() -> None:
    text = "né ✓"
    data = list(text.encode())
    detokenizer = IncrementalDetokenizer(_ByteTokenizer(), list(b"say "))
    pieces = [detokenizer.add([b]) for b in data]
    assert "".join(pieces) == text
    assert "\ufffd" not in "".join(pieces)
    assert pieces[1] == ""  # the first byte of "é" alone
    assert detokenizer.flush() == ""


def test_detokenizer_flushes_an_incomplete_tail() -> None:
    detokenizer = IncrementalDetokenizer(_ByteTokenizer(), [])
    assert detokenizer.add([ord("a"), 0xE2]) == ""  # held: it ends inside a character
    assert detokenizer.flush() == "a\ufffd"


@pytest.mark.parametrize(
    ("stops", "pieces", "shown", "is_stopped"),
    [
        pytest.param((), ["a", "b"], ["a", "b"], False, id="no-stops"),
        pytest.param(("END",), ["ab", "E", "N", "D", "x"], ["ab", "", "", "", ""], True, id="cut"),
        pytest.param(("END",), ["ab", "E", "x"], ["ab", "", "Ex"], False, id="false-alarm"),
        pytest.param(("xy", "b"), ["ab"], ["a"], True, id="earliest-wins"),
        pytest.param(("END",), ["aEN"], ["a"], False, id="held-until-known"),
    ],
)
def test_stop_strings(
    stops: tuple[str, ...], pieces: list[str], shown: list[str], is_stopped: bool
) -> None:
    checker = StopStrings(stops)
    assert [checker.feed(p) for p in pieces] == shown
    assert checker.is_stopped is is_stopped


def test_stop_strings_release_the_held_tail_at_the_end() -> None:
    checker = StopStrings(["END"])
    assert checker.feed("aEN") == "a"
    assert checker.feed("", is_last=True) == "EN"


@pytest.mark.parametrize(
    ("doc", "param"),
    [
        pytest.param({"temperature": -0.1}, "temperature", id="temperature-low"),
        pytest.param({"temperature": 2.5}, "temperature", id="temperature-high"),
        pytest.param({"temperature": True}, "temperature", id="temperature-bool"),
        pytest.param({"top_p": 1.5}, "top_p", id="top-p-high"),
        pytest.param({"top_p": 0}, "top_p", id="top-p-zero"),
        pytest.param({"max_tokens": 1.5}, "max_tokens", id="max-tokens-fraction"),
        pytest.param({"max_tokens": 0}, "max_tokens", id="max-tokens-zero"),
        pytest.param({"seed": "1"}, "seed", id="seed-string"),
        pytest.param({"stop": 3}, "stop", id="stop-number"),
        pytest.param({"stop": ["a", "b", "c", "d", "e"]}, "stop", id="stop-five"),
    ],
)
def test_bad_sampling_parameters_name_the_parameter(doc: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidParameterError) as caught:
        sampling_from_mapping(doc, default_max_tokens=16)
    assert caught.value.param == param


def test_sampling_defaults_are_openais() -> None:
    assert sampling_from_mapping({}, default_max_tokens=16) == SamplingParams(max_tokens=16)
    parsed = sampling_from_mapping(
        {"max_tokens": 4.0, "temperature": 0, "stop": "x", "seed": 7, "other": 1},
        default_max_tokens=None,
    )
    assert parsed == SamplingParams(max_tokens=4, temperature=0.0, stop=("x",), seed=7)
    assert parsed.is_greedy
    assert sampling_from_mapping({}, default_max_tokens=None).max_tokens is None


def test_engine_parameters_are_typed_and_checked() -> None:
    config = ModelConfig(backend="transformers")
    config.parameters["max_model_len"].string_value = " 128 "
    values = read_parameters(config, COMMON)
    assert values["max_model_len"] == 128
    assert values["max_num_seqs"] == 64
    config.parameters["dtype"].string_value = "int3"
    with pytest.raises(ParameterError, match="dtype"):
        read_parameters(config, COMMON)
