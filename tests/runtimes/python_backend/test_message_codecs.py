"""The stub messages' two codecs (`messages.encode`/`decode`, orjson where the interpreter has
it, and `encode_json`/`decode_json`, the standard library's, which a stub in a model's own
environment may be left with): each reads what the other writes, the odd values orjson
refuses included, both refuse the same malformed bodies, and without orjson the first is the
second."""

from __future__ import annotations

import math
from typing import Any

import pytest

from runtimes.python_backend import messages

EXECUTE = {
    "kind": "execute",
    "id": 7,
    "requests": [
        {
            "id": "req-1",
            "correlation_id": 2**64 - 1,  # a uint64 sequence id, orjson's largest integer
            "parameters": '{"note":"é","n":NaN}',  # pre-encoded by json, NaN as its text
            "requested": ["OUTPUT0"],
            "flags": 0,
            "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "offset": 64}],
        }
    ],
}


def _body(frame: bytes) -> bytes:
    assert messages.body_length(frame[: messages.HEADER.size]) == len(frame) - 4
    return frame[messages.HEADER.size :]


def test_orjson_writes_where_it_is_installed() -> None:
    # The server's environment has it. json escapes the "é" of EXECUTE; orjson writes UTF-8.
    assert messages.encode(EXECUTE) != messages.encode_json(EXECUTE)


@pytest.mark.parametrize(
    "message",
    [
        EXECUTE,
        {"kind": "finalize"},
        {"kind": "bls", "call": 3, "timeout": 1.5, "parameters": "{}", "inputs": []},
        {"kind": "log", "level": "INFO", "message": "a \u2603 and a \x00"},
        {"kind": "bls", "call": 1, "correlation_id": 2**70},  # past orjson: json writes it
    ],
    ids=["execute", "finalize", "floats", "unicode", "huge-int"],
)
def test_each_codec_reads_what_the_other_writes(message: dict[str, Any]) -> None:
    assert messages.decode_json(_body(messages.encode(message))) == message
    assert messages.decode(_body(messages.encode_json(message))) == message
    assert messages.decode(_body(messages.encode(message))) == message


def test_the_floats_json_writes_and_orjson_refuses_are_read() -> None:
    from_json = messages.encode_json({"kind": "bls", "call": 1, "timeout": math.inf})
    assert b"Infinity" in from_json
    assert messages.decode(_body(from_json))["timeout"] == math.inf
    # orjson cannot write it either: the message goes out as json's text.
    assert messages.encode({"kind": "bls", "call": 1, "correlation_id": 2**70}) == (
        messages.encode_json({"kind": "bls", "call": 1, "correlation_id": 2**70})
    )


@pytest.mark.parametrize(
    "body",
    [b"[1, 2]", b'{"no_kind": 1}', b'{"kind": 5}', b"{not json", b"\xff\xfe"],
    ids=["array", "no-kind", "kind-not-text", "not-json", "not-utf8"],
)
def test_both_codecs_refuse_the_same_malformed_bodies(body: bytes) -> None:
    with pytest.raises(ValueError):
        messages.decode_json(body)
    with pytest.raises(ValueError):
        messages.decode(body)


def test_without_orjson_the_standard_library_does_it_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "orjson", None)

    assert messages.encode(EXECUTE) == messages.encode_json(EXECUTE)
    assert messages.decode(_body(messages.encode_json(EXECUTE))) == EXECUTE
    with pytest.raises(ValueError):
        messages.decode(b"{not json")


def test_a_frame_buffer_joins_split_frames_and_splits_joined_ones() -> None:
    frames = messages.FrameBuffer()
    data = messages.encode({"kind": "a"}) + messages.encode_json({"kind": "b"})
    frames.feed(data[:5])
    assert list(frames.messages()) == []
    frames.feed(data[5:])
    assert [m["kind"] for m in frames.messages()] == ["a", "b"]
