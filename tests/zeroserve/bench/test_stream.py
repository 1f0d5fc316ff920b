"""``--stream``: SSE answers from small loopback servers, read by both loops; counts and
error kinds are asserted, never times."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.zeroserve.bench.test_loops import _read_request, _server
from zeroserve.bench.client import Endpoint
from zeroserve.bench.closed_loop import ClosedLoop, LoadPlan
from zeroserve.bench.open_loop import OpenLoop
from zeroserve.bench.payload import http_request, openai_body
from zeroserve.bench.sse import StreamMeter

pytestmark = pytest.mark.anyio

WORDS = ["Hel", "lo", " wor", "ld", "!"]


def _event(document: object) -> bytes:
    return b"data: " + json.dumps(document).encode() + b"\n\n"


def _text_events(chat: bool = False) -> list[bytes]:
    if chat:
        return [_event({"choices": [{"index": 0, "delta": {"content": w}}]}) for w in WORDS]
    return [_event({"choices": [{"index": 0, "text": w}]}) for w in WORDS]


async def _send_chunked(writer: asyncio.StreamWriter, pieces: list[bytes]) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    for piece in pieces:
        writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        await writer.drain()
    writer.write(b"0\r\n\r\n")


def _streaming(pieces: list[bytes]):
    async def behaviour(reader, writer):
        while await _read_request(reader):
            await _send_chunked(writer, pieces)

    return behaviour


WITH_USAGE = [
    b": keep-alive\n\n",
    _event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
    *_text_events(chat=True),
    _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}}),
    b"data: [DONE]\n\n",
]
WITHOUT_USAGE = [*_text_events(), b"data: [DONE]\n\n"]
# The same events split mid-line, with CRLF line ends.
SPLIT = [b"da", b"ta: " + json.dumps({"choices": [{"text": "a"}]}).encode() + b"\r", b"\n\r\n"]
SPLIT += [_event({"choices": [{"text": "b"}]})[:9], _event({"choices": [{"text": "b"}]})[9:]]
SPLIT += [b"data: [DO", b"NE]\r\n\r\n"]
NO_DONE = _text_events()
ERROR_EVENT = [
    *_text_events()[:2],
    b'event: error\ndata: {"message": "oom"}\n\n',
    b"data: [DONE]\n\n",
]
ERROR_DATA = [*_text_events()[:2], _event({"error": {"message": "oom"}}), b"data: [DONE]\n\n"]


def _plan(endpoint: Endpoint) -> LoadPlan:
    body = openai_body("m", route="chat", prompt="hi", max_tokens=8, is_stream=True)
    request = http_request(endpoint.host_header, "POST", "/v1/chat/completions", body)
    return LoadPlan(
        endpoint=endpoint,
        requests=(request,),
        warmup_s=0.0,
        duration_s=0.3,
        timeout_s=5.0,
        connect_timeout_s=2.0,
        is_stream=True,
    )


def test_body_asks_for_a_stream_with_usage():
    body = openai_body("m", route="completions", prompt="hi", max_tokens=8, is_stream=True)
    document = json.loads(body.content)
    assert document["stream"] is True
    assert document["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("pieces", "tokens", "chunks", "source"),
    [
        pytest.param(WITH_USAGE, 7, 5, "usage", id="usage"),
        pytest.param(WITHOUT_USAGE, 5, 5, "chunks", id="chunks"),
        pytest.param(SPLIT, 2, 2, "chunks", id="split"),
    ],
)
def test_meter_counts_tokens(pieces, tokens, chunks, source):
    meter = StreamMeter()
    for at, piece in enumerate(pieces, start=1):
        meter.feed(piece, at * 1000)
    assert meter.is_complete
    assert meter.chunks == chunks and meter.tokens == tokens and meter.tokens_from == source
    assert len(meter.gaps_ns) == chunks - 1
    meter.reset()
    assert meter.chunks == 0 and not meter.is_done and meter.usage_tokens is None


@pytest.mark.parametrize(
    "pieces", [NO_DONE, ERROR_EVENT, ERROR_DATA], ids=["no done", "event", "data"]
)
def test_meter_flags_broken_streams(pieces):
    meter = StreamMeter()
    for piece in pieces:
        meter.feed(piece, 1)
    assert not meter.is_complete


@pytest.mark.parametrize(("pieces", "tokens"), [(WITH_USAGE, 7), (WITHOUT_USAGE, 5)])
async def test_closed_loop_measures_streams(pieces, tokens):
    async with _server(_streaming(pieces)) as endpoint:
        result = await ClosedLoop(_plan(endpoint), 2).run()
    assert result.ok > 0 and result.errors == {}
    stream = result.stream
    assert stream is not None
    assert stream.streams == result.ok
    assert stream.tokens == tokens * result.ok
    assert stream.ttft.count == result.ok
    assert stream.itl.count == (len(WORDS) - 1) * result.ok
    assert stream.tokens_per_s == pytest.approx(stream.tokens / result.duration_s)
    document = result.to_json()["stream"]
    assert document["tokens"] == stream.tokens
    assert document["ttft"]["p99_ms"] is not None


@pytest.mark.parametrize("pieces", [NO_DONE, ERROR_EVENT], ids=["no done", "error event"])
async def test_broken_streams_are_stream_errors(pieces):
    async with _server(_streaming(pieces)) as endpoint:
        closed = await ClosedLoop(_plan(endpoint), 2).run()
        opened = await OpenLoop(_plan(endpoint), 100.0, seed=0, max_connections=4).run()
    for result in (closed, opened):
        assert result.ok == 0
        assert set(result.errors) == {"stream"}
        assert result.stream is not None and result.stream.streams == 0


async def test_open_loop_measures_streams():
    async with _server(_streaming(WITH_USAGE)) as endpoint:
        result = await OpenLoop(_plan(endpoint), 100.0, seed=1, max_connections=4).run()
    assert result.ok > 0 and result.errors == {}
    assert result.stream is not None
    assert result.stream.streams > 0
    assert result.stream.tokens == 7 * result.stream.streams
    assert result.stream.tokens_from == "usage"
