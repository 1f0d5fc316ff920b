"""`activator.grpc.front.FrontContext`: what the router's handlers read of a call on the
h2corn front end matches what grpc.aio gives them (the end-to-end cases are the router's
tests, on h2corn by default and on grpc.aio with ``ZEROSERVE_ACTIVATOR_GRPC_FRONTEND=aio``;
the access log's run on both)."""

from __future__ import annotations

import base64

import grpc
import pytest

from activator.grpc.front import FrontContext
from foundation.grpc_front.app import CallContext
from foundation.grpc_front.wire import RpcStatusError

pytestmark = pytest.mark.anyio


def test_metadata_as_grpc_aio_gives_it() -> None:
    binary = bytes(range(5))
    headers = [
        (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"host", b"127.0.0.1:8001"),
        (b"x-request-id", b"abc"),
        (b"trace-bin", base64.b64encode(binary).rstrip(b"=")),
        (b"broken-bin", b"!!"),
        (b"grpc-timeout", b"5S"),
    ]
    context = FrontContext(CallContext(headers, None))
    assert context.invocation_metadata() == (
        ("x-request-id", "abc"),
        ("trace-bin", binary),
        ("grpc-timeout", "5S"),
    )
    assert context.time_remaining() is None


async def test_abort_carries_the_trailing_metadata() -> None:
    context = FrontContext(CallContext([], None))
    with pytest.raises(RpcStatusError) as raised:
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            "no replica",
            (("grpc-retry-pushback-ms", "3000"), ("detail-bin", b"\x00\x01")),
        )
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE
    assert raised.value.message == "no replica"
    assert list(raised.value.trailers) == [
        (b"grpc-retry-pushback-ms", b"3000"),
        (b"detail-bin", b"AAE"),
    ]
