"""gRPC-Web: the wire helpers on their own, and a `GrpcApp` answering gRPC-Web over a real
uvicorn HTTP/1.1 server to httpx (statuses, trailers, metadata, deadlines, a client that
leaves)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import struct
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
import uvicorn

from foundation.grpc_front.app import GrpcApp
from foundation.grpc_front.web import (
    CONTENT_TYPE,
    GrpcWebApp,
    WebProtocolError,
    is_grpc_web,
    metadata_headers,
    parse_answer,
    request_body,
    timeout_header,
)
from tests.foundation.grpc_front.serving import Recorder, example_rpcs
from tests.uvicorn_server import serving

pytestmark = pytest.mark.anyio

WAIT_S = 30.0
LIMIT_BYTES = 64 * 1024


def _frame(flag: int, data: bytes) -> bytes:
    return struct.pack(">BI", flag, len(data)) + data


def test_an_answer_with_its_message_and_status() -> None:
    body = _frame(0, b"hello") + _frame(0x80, b"grpc-status:0\r\nx-note:kept\r\n")
    answer = parse_answer(body, LIMIT_BYTES)
    assert answer.code == grpc.StatusCode.OK
    assert answer.messages == [b"hello"]
    assert answer.trailing_metadata == (("x-note", "kept"),)


def test_an_error_status_its_decoded_message_and_binary_metadata() -> None:
    raw = bytes(range(5))
    encoded = base64.b64encode(raw).rstrip(b"=")
    block = b"grpc-status:5\r\ngrpc-message:no%20such%25 model\r\nx-why-bin:" + encoded + b"\r\n"
    answer = parse_answer(_frame(0x80, block), LIMIT_BYTES)
    assert answer.code == grpc.StatusCode.NOT_FOUND
    assert answer.message == "no such% model"
    assert answer.messages == []
    assert answer.trailing_metadata == (("x-why-bin", raw),)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "no trailers"),
        (_frame(0, b"a"), "no trailers"),
        (_frame(0, b"abc")[:-1], "inside a frame"),
        (_frame(0x80, b"grpc-status:0\r\n") + b"x", "after the trailers"),
        (_frame(1, b"zz") + _frame(0x80, b"grpc-status:0\r\n"), "flag"),
        (_frame(0x80, b"x-a:b\r\n"), "no grpc-status"),
        (_frame(0x80, b"grpc-status:99\r\n"), "unknown grpc-status"),
        (_frame(0x80, b"grpc-status\r\n"), "without ':'"),
        (_frame(0x80, b"grpc-status:0\r\nx-bin:@@@\r\n"), "not base64"),
        (_frame(0, b"x" * (LIMIT_BYTES + 1)) + _frame(0x80, b"grpc-status:0\r\n"), "larger"),
    ],
)
def test_a_malformed_answer_is_refused(body: bytes, reason: str) -> None:
    with pytest.raises(WebProtocolError, match=reason):
        parse_answer(body, LIMIT_BYTES)


def test_timeouts_round_up_to_milliseconds_and_never_to_none() -> None:
    assert timeout_header(0.0) == b"1m"
    assert timeout_header(0.0004) == b"1m"
    assert timeout_header(1.5) == b"1500m"
    assert timeout_header(2.0001) == b"2001m"
    assert timeout_header(10**6) == b"1000000S"


def test_metadata_becomes_headers_binary_values_in_base64() -> None:
    headers = metadata_headers([("x-id", "7"), ("trace-bin", b"\x00\xff")])
    assert headers == [(b"x-id", b"7"), (b"trace-bin", base64.b64encode(b"\x00\xff"))]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("transfer-encoding", "chunked"),
        ("content-length", "0"),
        ("connection", "close"),
        ("host", "elsewhere"),
        ("content-type", "text/plain"),
        ("x-split", "a\r\nx-injected: 1"),
        ("x-null", "a\0b"),
        ("x-wide", "caf\u00e9"),
    ],
)
def test_metadata_that_would_change_the_request_is_not_sent(key: str, value: str) -> None:
    assert metadata_headers([(key, value), ("x-kept", "1")]) == [(b"x-kept", b"1")]


@pytest.mark.parametrize(
    ("content_type", "is_web"),
    [
        (b"application/grpc-web", True),
        (b"application/grpc-web+proto", True),
        (b"Application/gRPC-Web+proto; charset=x", True),
        (b"application/grpc-web-text", False),
        (b"application/grpc", False),
        (b"application/json", False),
    ],
)
def test_only_binary_grpc_web_is_taken(content_type: bytes, is_web: bool) -> None:
    assert is_grpc_web({"headers": [(b"content-type", content_type)]}) is is_web
    assert not is_grpc_web({"headers": []})


@contextlib.asynccontextmanager
async def _web_server() -> AsyncIterator[tuple[str, Recorder]]:
    recorder = Recorder()
    app = GrpcApp(
        example_rpcs(recorder),
        max_receive_bytes=LIMIT_BYTES,
        max_send_bytes=LIMIT_BYTES,
        max_concurrent_rpcs=10,
    )
    config = uvicorn.Config(
        GrpcWebApp(app), host="127.0.0.1", port=0, lifespan="off", log_level="error"
    )
    async with serving(uvicorn.Server(config)) as url:
        yield url, recorder


async def _call(
    client: httpx.AsyncClient, method: str, message: bytes, *headers: tuple[str, str]
) -> httpx.Response:
    return await client.post(
        f"/t.Test/{method}",
        content=request_body(message),
        headers=[("content-type", CONTENT_TYPE.decode()), *headers],
        timeout=WAIT_S,
    )


async def test_calls_answer_with_their_message_or_status_in_the_last_frame() -> None:
    async with _web_server() as (url, recorder), httpx.AsyncClient(base_url=url) as client:
        echoed = await _call(client, "Echo", b"abc", ("x-id", "7"), ("grpc-timeout", "50S"))
        assert echoed.status_code == 200
        assert echoed.headers["content-type"] == CONTENT_TYPE.decode()
        answer = parse_answer(echoed.content, LIMIT_BYTES)
        assert (answer.code, answer.messages) == (grpc.StatusCode.OK, [b"cba"])
        assert (b"x-id", b"7") in recorder.metadata[-1]
        remaining = recorder.time_remaining[-1]
        assert remaining is not None and 0 < remaining <= 50

        failed = parse_answer((await _call(client, "Fail", b"bad input")).content, LIMIT_BYTES)
        assert (failed.code, failed.message) == (grpc.StatusCode.INVALID_ARGUMENT, "bad input")
        assert failed.trailing_metadata == (("x-why", "a test"),)

        unknown = parse_answer((await _call(client, "Nope", b"")).content, LIMIT_BYTES)
        assert unknown.code == grpc.StatusCode.UNIMPLEMENTED

        late = parse_answer(
            (await _call(client, "Slow", b"", ("grpc-timeout", "100m"))).content, LIMIT_BYTES
        )
        assert late.code == grpc.StatusCode.DEADLINE_EXCEEDED

        big = await client.post(
            "/t.Test/Echo",
            content=request_body(b"x" * (LIMIT_BYTES + 1)),
            headers={"content-type": CONTENT_TYPE.decode()},
        )
        assert parse_answer(big.content, LIMIT_BYTES).code == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_a_client_that_leaves_cancels_its_call() -> None:
    async with _web_server() as (url, recorder), httpx.AsyncClient(base_url=url) as client:
        slow = asyncio.ensure_future(_call(client, "Slow", b""))
        await asyncio.wait_for(asyncio.to_thread(recorder.slow_started.acquire), WAIT_S)
        slow.cancel()  # httpx closes the connection under a cancelled request
        with contextlib.suppress(asyncio.CancelledError):
            await slow
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while recorder.cancelled == 0:
            assert asyncio.get_running_loop().time() < deadline, "the call was not cancelled"
            await asyncio.sleep(0.01)
        # The server goes on serving others.
        echoed = parse_answer((await _call(client, "Echo", b"ok")).content, LIMIT_BYTES)
        assert echoed.messages == [b"ko"]
