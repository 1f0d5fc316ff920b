"""The server writes and reads the stub messages with orjson (`server_messages`), the stub
with the standard library's json (`messages`): each side reads what the other writes, the
odd values orjson refuses included, and both refuse the same malformed frames."""

from __future__ import annotations

import math
from typing import Any

import pytest

from runtimes.python_backend import messages, server_messages

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
def test_each_side_reads_what_the_other_writes(message: dict[str, Any]) -> None:
    assert messages.decode(_body(server_messages.encode(message))) == message
    assert server_messages.decode(_body(messages.encode(message))) == message


def test_the_floats_json_writes_and_orjson_refuses_are_read() -> None:
    from_stub = messages.encode({"kind": "bls", "call": 1, "timeout": math.inf})
    assert b"Infinity" in from_stub
    assert server_messages.decode(_body(from_stub))["timeout"] == math.inf


@pytest.mark.parametrize(
    "body",
    [b"[1, 2]", b'{"no_kind": 1}', b'{"kind": 5}', b"{not json", b"\xff\xfe"],
    ids=["array", "no-kind", "kind-not-text", "not-json", "not-utf8"],
)
def test_both_sides_refuse_the_same_malformed_bodies(body: bytes) -> None:
    with pytest.raises(ValueError):
        messages.decode(body)
    with pytest.raises(ValueError):
        server_messages.decode(body)


def test_a_frame_buffer_reads_with_the_decoder_it_is_given() -> None:
    seen: list[bytes] = []

    def decode(body: bytes) -> messages.Message:
        seen.append(body)
        return server_messages.decode(body)

    frames = messages.FrameBuffer(decode)
    data = messages.encode({"kind": "a"}) + messages.encode({"kind": "b"})
    frames.feed(data[:5])
    assert list(frames.messages()) == []
    frames.feed(data[5:])
    assert [m["kind"] for m in frames.messages()] == ["a", "b"] and len(seen) == 2
