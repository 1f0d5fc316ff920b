"""Request decompression (bounded) and response compression, checked with tritonclient."""

from __future__ import annotations

import asyncio
import gzip
import threading
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as triton_http
from tritonclient.http._infer_result import InferResult
from tritonclient.http._utils import _get_inference_request

from data_plane import compression
from data_plane.compression import choose_response_encoding, decode_body, encode_body
from data_plane.errors import InvalidArgumentError, UnsupportedCompressionError, ZeroserveError
from data_plane.protocol import OutputTensor, decode_infer_request, encode_infer_response
from tests.data_plane.llm_app import llm_app
from tests.models import write_onnx_add_sub

PAYLOAD = b"zeroserve speaks Triton " * 200
MIB = 2**20
WAIT_S = 30.0


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


def test_members_across_input_slices_keep_their_order() -> None:
    # Members of every size, straddling the slices the body is fed to zlib in.
    rng = np.random.default_rng(7)
    pieces = [rng.bytes(int(size)) for size in rng.integers(0, 3000, size=200)]
    body = b"".join(gzip.compress(piece, mtime=0) for piece in pieces)
    assert len(body) > 16 * 16 * 1024
    assert decode_body(body, "gzip", max_bytes=64 * MIB) == b"".join(pieces)


def test_the_member_limit_is_accepted() -> None:
    pieces = [b"%d," % index for index in range(compression.MAX_GZIP_MEMBERS)]
    body = b"".join(gzip.compress(piece, mtime=0) for piece in pieces)
    assert decode_body(body, "gzip", max_bytes=MIB) == b"".join(pieces)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_body_of_many_tiny_members_is_refused(encoding: str) -> None:
    # The probe's body: 4 MB of 200,000 empty members took the event loop 30 s to inflate.
    body = gzip.compress(b"", mtime=0) * 200_000
    with pytest.raises(InvalidArgumentError) as info:
        decode_body(body, encoding, max_bytes=64 * MIB)
    assert info.value.message == (
        f"failed to decompress the request body ({encoding}): more than "
        f"{compression.MAX_GZIP_MEMBERS} concatenated members"
    )


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
        pytest.param(
            PAYLOAD, "br", UnsupportedCompressionError, "Unsupported compression type", id="br"
        ),
        pytest.param(
            PAYLOAD,
            "gzip, deflate",
            UnsupportedCompressionError,
            "Unsupported compression type",
            id="list",
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
    assert sorted(compression.__all__) == [
        "MAX_GZIP_MEMBERS",
        "choose_response_encoding",
        "decode_body",
        "decode_body_off_loop",
        "encode_body",
    ]


@pytest.mark.anyio
async def test_inflating_leaves_the_event_loop_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compressed infer body is inflated on another thread: while it inflates (held here
    until the health answer comes), the server answers other requests."""
    write_onnx_add_sub(tmp_path / "repo", "addsub", dims=(4,))
    started, released = threading.Event(), threading.Event()
    real_inflate = compression._inflate
    waited_in_vain: list[str] = []

    def held_inflate(*args: Any) -> bytes:
        started.set()
        # On the event loop this wait would stall the health request it waits for.
        if not released.wait(WAIT_S):
            waited_in_vain.append(threading.current_thread().name)
        return real_inflate(*args)

    monkeypatch.setattr(compression, "_inflate", held_inflate)
    request = {
        "inputs": [
            {"name": name, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
            for name in ("INPUT0", "INPUT1")
        ]
    }
    async with llm_app(tmp_path / "repo", tmp_path / "cache", models=("addsub",)) as served:
        infer = asyncio.create_task(
            served.client.post(
                "/v2/models/addsub/infer",
                content=gzip.compress(orjson.dumps(request)),
                headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
            )
        )
        try:
            assert await asyncio.to_thread(started.wait, WAIT_S)
            health = await served.client.get("/v2/health/live")
            released.set()
            answer = await asyncio.wait_for(infer, WAIT_S)
        finally:
            released.set()
            infer.cancel()
    assert health.status_code == 200
    assert waited_in_vain == []
    assert answer.status_code == 200, answer.text
    outputs = {output["name"]: output["data"] for output in answer.json()["outputs"]}
    assert outputs == {"OUTPUT0": [2, 4, 6, 8], "OUTPUT1": [0, 0, 0, 0]}
