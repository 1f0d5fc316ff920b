"""The gRPC front end as grpcio's client sees it: calls and streams, statuses, metadata,
deadlines, cancellation, compression, and the message and call limits."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from foundation.grpc_limits import GrpcLimits
from tests.foundation.grpc_front.serving import Front, call, serving, stream, unary

LIMIT_BYTES = 64 * 1024
WAIT_S = 60.0


@pytest.fixture(scope="module")
def front() -> Iterator[Front]:
    limits = GrpcLimits(
        grpc_max_receive_bytes=LIMIT_BYTES,
        grpc_max_send_bytes=LIMIT_BYTES,
        grpc_max_concurrent_rpcs=3,
    )
    with serving(limits) as running:
        yield running


def wait_for(predicate: object) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_unary_call_with_metadata_and_deadline(front: Front) -> None:
    assert call(front.address, "Echo", b"abc", metadata=[("x-id", "7")], timeout=50.0) == b"cba"
    assert (b"x-id", b"7") in front.recorder.metadata[-1]
    remaining = front.recorder.time_remaining[-1]
    # gRPC core rounds the timeout it sends up (to 50100m, say).
    assert remaining is not None and 0 < remaining <= 51.0
    call(front.address, "Echo", b"abc", timeout=None)
    assert front.recorder.time_remaining[-1] is None


def test_gzip_request(front: Front) -> None:
    payload = b"0123456789" * 1000
    answer = call(front.address, "Echo", payload, compression=grpc.Compression.Gzip)
    assert answer == payload[::-1]


def test_status_message_and_trailers_reach_the_client(front: Front) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        call(front.address, "Fail", "bad input: 100% ✗".encode())
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == "bad input: 100% ✗"
    trailers = {item.key: item.value for item in raised.value.trailing_metadata() or ()}
    assert trailers["x-why"] in ("a test", b"a test")  # str at run time, bytes in the stubs


def test_unknown_method(front: Front) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        call(front.address, "Nope", b"")
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_messages_over_the_limits(front: Front) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        call(front.address, "Echo", b"x" * (LIMIT_BYTES + 1))
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in (raised.value.details() or "")
    with pytest.raises(grpc.RpcError) as raised:
        call(front.address, "Big", str(LIMIT_BYTES + 1).encode())
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert call(front.address, "Big", str(LIMIT_BYTES).encode()) == b"x" * LIMIT_BYTES


def test_deadline_cancels_the_handler(front: Front) -> None:
    before = front.recorder.cancelled
    with pytest.raises(grpc.RpcError) as raised:
        call(front.address, "Slow", b"", timeout=0.5)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert front.recorder.slow_started.acquire(timeout=WAIT_S)
    wait_for(lambda: front.recorder.cancelled == before + 1)


def test_client_cancel_cancels_the_handler(front: Front) -> None:
    before = front.recorder.cancelled
    with grpc.insecure_channel(front.address) as channel:
        future = unary(channel, "Slow").future(b"", timeout=WAIT_S)
        assert front.recorder.slow_started.acquire(timeout=WAIT_S)
        future.cancel()
    wait_for(lambda: front.recorder.cancelled == before + 1)
    assert front.app.active_rpcs == 0


def test_calls_beyond_the_bound_are_refused(front: Front) -> None:
    with grpc.insecure_channel(front.address) as channel:
        slow = unary(channel, "Slow")
        held = [slow.future(b"", timeout=WAIT_S) for _ in range(3)]
        for _ in held:
            assert front.recorder.slow_started.acquire(timeout=WAIT_S)
        with pytest.raises(grpc.RpcError) as raised:
            unary(channel, "Echo")(b"x", timeout=WAIT_S)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        for future in held:
            future.cancel()
    wait_for(lambda: front.app.active_rpcs == 0)
    assert call(front.address, "Echo", b"ok") == b"ko"


def test_stream_both_ways(front: Front) -> None:
    with grpc.insecure_channel(front.address) as channel:
        chat = stream(channel, "Chat")
        answers = list(chat(iter([b"a", b"bb", b""]), timeout=WAIT_S))
    assert answers == [b"a", b"a", b"bb", b"bb", b"", b""]


def test_stream_cancelled_midway(front: Front) -> None:
    def requests() -> Iterator[bytes]:
        yield b"first"
        time.sleep(WAIT_S)  # never sends more: the client cancels

    with grpc.insecure_channel(front.address) as channel:
        answers = stream(channel, "Chat")(requests(), timeout=WAIT_S)
        assert next(answers) == b"first"
        answers.cancel()
    wait_for(lambda: front.app.active_rpcs == 0)


def test_drain_finishes_a_call_in_flight() -> None:
    with serving(drain_timeout_s=WAIT_S) as running:
        channel = grpc.insecure_channel(running.address)
        future = unary(channel, "Slow").future(b"0.5", timeout=WAIT_S)
        assert running.recorder.slow_started.acquire(timeout=WAIT_S)
        # Leaving stops the server, which waits for the call.
    try:
        assert future.result() == b"0.5"
    finally:
        channel.close()
