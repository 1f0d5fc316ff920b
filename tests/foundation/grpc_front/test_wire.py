"""The gRPC wire rules on their own: framing, grpc-timeout, status trailers, and
decompression bounded by the message limit."""

from __future__ import annotations

import zlib

import grpc
import pytest

from foundation.grpc_front.wire import (
    MessageReader,
    RpcStatusError,
    compress,
    decompress,
    frame,
    parse_timeout,
    status_trailers,
)


def test_messages_split_across_chunks_and_packed_in_one() -> None:
    reader = MessageReader(1024, "identity")
    body = frame(b"first") + frame(b"") + frame(b"third" * 10)
    received = []
    for i in range(0, len(body), 3):
        received += reader.feed(body[i : i + 3])
    reader.finish()
    assert received == [b"first", b"", b"third" * 10]
    assert MessageReader(1024, "identity").feed(body) == received


def test_a_message_over_the_limit_is_refused_from_its_prefix() -> None:
    reader = MessageReader(100, "identity")
    with pytest.raises(RpcStatusError) as raised:
        reader.feed(frame(b"x" * 101)[:5])
    assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max (101 vs. 100)" in raised.value.message


def test_a_body_ending_inside_a_message_is_an_error() -> None:
    reader = MessageReader(100, "identity")
    assert reader.feed(frame(b"abc")[:6]) == []
    with pytest.raises(RpcStatusError) as raised:
        reader.finish()
    assert raised.value.code == grpc.StatusCode.INTERNAL


def compressed_frame(data: bytes) -> bytes:
    return bytes([1]) + len(data).to_bytes(4, "big") + data


def test_gzip_and_deflate_messages_are_inflated() -> None:
    assert MessageReader(100, "gzip").feed(compressed_frame(compress(b"hello"))) == [b"hello"]
    assert MessageReader(100, "deflate").feed(compressed_frame(zlib.compress(b"hi"))) == [b"hi"]


def test_a_compression_bomb_stops_at_the_limit() -> None:
    bomb = compress(b"\0" * 10_000_000)  # 10 MB in about 10 KB
    with pytest.raises(RpcStatusError) as raised:
        decompress(bomb, "gzip", 1_000_000)
    assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    "data",
    [pytest.param(b"not gzip", id="garbage"), pytest.param(compress(b"abc")[:-6], id="cut")],
)
def test_broken_compressed_messages_are_errors(data: bytes) -> None:
    with pytest.raises(RpcStatusError) as raised:
        decompress(data, "gzip", 100)
    assert raised.value.code == grpc.StatusCode.INTERNAL


def test_a_compressed_flag_without_an_encoding_is_an_error() -> None:
    with pytest.raises(RpcStatusError) as raised:
        MessageReader(100, "identity").feed(compressed_frame(compress(b"x")))
    assert raised.value.code == grpc.StatusCode.INTERNAL


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1S", 1.0),
        ("250m", 0.25),
        ("3M", 180.0),
        ("2H", 7200.0),
        ("5u", 5e-6),
        ("99999999n", 0.099999999),
    ],
)
def test_timeouts(value: str, seconds: float) -> None:
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "S", "1", "1x", "123456789S", "-1S", "1.5S"])
def test_malformed_timeouts(value: str) -> None:
    with pytest.raises(RpcStatusError):
        parse_timeout(value)


def test_status_trailers_percent_encode_the_message() -> None:
    assert status_trailers(grpc.StatusCode.OK, "") == [(b"grpc-status", b"0")]
    assert status_trailers(grpc.StatusCode.NOT_FOUND, "100% café\n") == [
        (b"grpc-status", b"5"),
        (b"grpc-message", b"100%25 caf%C3%A9%0A"),
    ]
