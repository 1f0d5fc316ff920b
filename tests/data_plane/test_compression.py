"""Request decompression (bounded) and response compression, checked with tritonclient."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.http._infer_result import InferResult
from tritonclient.http._utils import _get_inference_request

from data_plane import compression
from data_plane.compression import choose_response_encoding, decode_body, encode_body
from data_plane.errors import InvalidArgumentError, UnsupportedError, ZeroserveError
from data_plane.protocol import OutputTensor, decode_infer_request, encode_infer_response

PAYLOAD = b"zeroserve speaks Triton " * 200
MIB = 2**20


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def too_big(limit: int) -> str:
    return (
        f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. "
        "Use --http-max-input-size to increase the limit."
    )


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        pytest.param("gzip", gzip.compress, id="gzip"),
        pytest.param("deflate", zlib.compress, id="deflate-zlib"),
        pytest.param("deflate", raw_deflate, id="deflate-raw"),
        pytest.param("deflate", gzip.compress, id="deflate-given-gzip"),
        pytest.param("gzip", zlib.compress, id="gzip-given-zlib"),
        pytest.param("GZIP", gzip.compress, id="case-insensitive"),
    ],
)
def test_decode_body_round_trips(encoding: str, compress: Any) -> None:
    assert decode_body(compress(PAYLOAD), encoding, max_bytes=MIB) == PAYLOAD


@pytest.mark.parametrize("encoding", [None, "", "identity"])
def test_identity_returns_the_body_itself(encoding: str | None) -> None:
    assert decode_body(PAYLOAD, encoding, max_bytes=1) is PAYLOAD


def test_concatenated_gzip_members() -> None:
    body = gzip.compress(b"first ") + gzip.compress(b"second")
    assert decode_body(body, "gzip", max_bytes=MIB) == b"first second"


def test_exactly_the_limit_is_accepted() -> None:
    data = bytes(range(256)) * 4
    assert decode_body(gzip.compress(data), "gzip", max_bytes=len(data)) == data
    with pytest.raises(InvalidArgumentError) as info:
        decode_body(gzip.compress(data), "gzip", max_bytes=len(data) - 1)
    assert info.value.message == too_big(len(data) - 1)


def test_members_together_count_against_the_limit() -> None:
    body = gzip.compress(bytes(600)) + gzip.compress(bytes(600))
    with pytest.raises(InvalidArgumentError) as info:
        decode_body(body, "gzip", max_bytes=1000)
    assert info.value.message == too_big(1000)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_bomb_is_stopped_without_inflating_it(encoding: str) -> None:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
    chunk = bytes(MIB)
    bomb = b"".join(compressor.compress(chunk) for _ in range(64)) + compressor.flush()
    assert len(bomb) < MIB // 8  # 64 MiB of zeros
    tracemalloc.start()
    try:
        with pytest.raises(InvalidArgumentError) as info:
            decode_body(bomb, encoding, max_bytes=MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.message == too_big(MIB)
    assert peak < 4 * MIB


@pytest.mark.parametrize(
    ("body", "encoding", "error", "message"),
    [
        pytest.param(PAYLOAD, "br", UnsupportedError, "Unsupported compression type", id="br"),
        pytest.param(
            PAYLOAD, "gzip, deflate", UnsupportedError, "Unsupported compression type", id="list"
        ),
        pytest.param(b"", "gzip", InvalidArgumentError, "nothing to be decompressed", id="empty"),
        pytest.param(
            gzip.compress(PAYLOAD)[:-12],
            "gzip",
            InvalidArgumentError,
            "failed to decompress the request body (gzip): truncated data",
            id="truncated",
        ),
        pytest.param(
            b"not compressed",
            "gzip",
            InvalidArgumentError,
            "failed to decompress the request body (gzip): Error -3 while decompressing data: "
            "incorrect header check",
            id="gzip-garbage",
        ),
        pytest.param(
            b"\xff" * 16,
            "deflate",
            InvalidArgumentError,
            "failed to decompress the request body (deflate): Error -3 while decompressing "
            "data: invalid block type",
            id="deflate-garbage",
        ),
        pytest.param(
            gzip.compress(PAYLOAD) + b"junk",
            "gzip",
            InvalidArgumentError,
            "failed to decompress the request body (gzip): Error -3 while decompressing data: "
            "incorrect header check",
            id="trailing-junk",
        ),
    ],
)
def test_decode_body_errors(
    body: bytes, encoding: str, error: type[ZeroserveError], message: str
) -> None:
    with pytest.raises(error) as info:
        decode_body(body, encoding, max_bytes=MIB)
    assert type(info.value) is error
    assert info.value.message == message


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_client_request(algorithm: str) -> None:
    """The header length names the decompressed JSON, as tritonclient computes it."""
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = triton_http.InferInput("X", [2, 4], "FP32")
    tensor.set_data_from_numpy(data)
    body, length = _get_inference_request([tensor], "1", None, 0, False, False, 0, None, None)
    # tritonclient's InferenceServerClient.infer compresses exactly like this
    sent = gzip.compress(body) if algorithm == "gzip" else zlib.compress(body)
    plain = decode_body(sent, algorithm, max_bytes=MIB)
    request = decode_infer_request(plain, header_length=length, model="m")
    assert request.inputs[0].data.tolist() == data.tolist()


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, None),
        ("", None),
        ("identity", None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip, deflate", "gzip"),
        ("deflate, gzip", "deflate"),
        ("gzip;q=0.5, deflate;q=0.8", "deflate"),
        ("gzip;q=0.9, identity;q=1", None),
        ("gzip;q=0", None),
        ("gzip;q=abc, deflate", "deflate"),
        ("br, *", None),
        ("  gzip", "gzip"),
        ("gzip ;q=1", None),  # Triton does not trim before ';q=', so this names no coding
    ],
)
def test_choose_response_encoding(accept: str | None, expected: str | None) -> None:
    assert choose_response_encoding(accept) == expected


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_encoded_response_is_read_by_the_client(encoding: str) -> None:
    data = np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)
    body, length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id=None,
        outputs=[OutputTensor("Y", "FP32", data, True)],
    )
    compressed = encode_body(body, encoding)
    assert compressed == encode_body(body, encoding)  # no timestamp in the gzip header
    result = InferResult.from_response_body(
        compressed, header_length=length, content_encoding=encoding
    )
    assert result.as_numpy("Y").tolist() == data.tolist()


def test_encode_body_refuses_unknown_encodings() -> None:
    with pytest.raises(ValueError, match="cannot encode a body as 'br'"):
        encode_body(PAYLOAD, "br")


def test_public_surface() -> None:
    assert sorted(compression.__all__) == ["choose_response_encoding", "decode_body", "encode_body"]
