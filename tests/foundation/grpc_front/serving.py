"""A `GrpcApp` over a few test methods, served by h2corn on a loop of its own in a thread,
so blocking clients (grpcio's, raw sockets) can call it from the test's thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

import grpc

from foundation.grpc_front.app import CallContext, GrpcApp, Metadata, StreamRpc, UnaryRpc
from foundation.grpc_front.server import serve_grpc_front
from foundation.grpc_front.wire import RpcStatusError
from foundation.grpc_limits import GrpcLimits
from foundation.serving import bind_socket
from tests.loop_thread import on_loop_thread

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
SLOW_S = 30.0
"""How long the Slow method waits: far longer than any test, which cancels it."""


@dataclass
class Recorder:
    """What the methods saw, read from the test's thread once calls are over."""

    metadata: list[Metadata] = field(default_factory=list)
    time_remaining: list[float | None] = field(default_factory=list)
    cancelled: int = 0
    slow_started: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))


def example_rpcs(recorder: Recorder) -> dict[str, UnaryRpc | StreamRpc]:
    """``/t.Test/Echo`` (answers the request reversed), ``Big`` (a request of ``n`` ASCII
    digits: that many bytes back), ``Fail`` (INVALID_ARGUMENT with the request as text and
    an ``x-why`` trailer), ``Slow`` (waits the seconds the request says, or
    :data:`SLOW_S`, counting cancellations) and ``Chat`` (each message back twice)."""

    async def echo(data: bytes, call: CallContext) -> bytes:
        recorder.metadata.append(call.metadata)
        recorder.time_remaining.append(call.time_remaining())
        return data[::-1]

    async def big(data: bytes, call: CallContext) -> bytes:
        return b"x" * int(data)

    async def fail(data: bytes, call: CallContext) -> bytes:
        raise RpcStatusError(
            grpc.StatusCode.INVALID_ARGUMENT, data.decode(), [(b"x-why", b"a test")]
        )

    async def slow(data: bytes, call: CallContext) -> bytes:
        recorder.slow_started.release()
        try:
            await asyncio.sleep(float(data) if data else SLOW_S)
        except asyncio.CancelledError:
            recorder.cancelled += 1
            raise
        return data

    async def chat(requests: AsyncIterator[bytes], call: CallContext) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request
            yield request

    return {
        "/t.Test/Echo": UnaryRpc(echo),
        "/t.Test/Big": UnaryRpc(big),
        "/t.Test/Fail": UnaryRpc(fail),
        "/t.Test/Slow": UnaryRpc(slow),
        "/t.Test/Chat": StreamRpc(chat),
    }


@dataclass
class Front:
    """A running front end: where it listens, and what its methods saw."""

    port: int
    recorder: Recorder
    app: GrpcApp

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextmanager
def serving(limits: GrpcLimits | None = None, drain_timeout_s: float = 5.0) -> Iterator[Front]:
    """The test methods under ``limits`` on a free port until exit."""
    limits = limits or GrpcLimits()

    @asynccontextmanager
    async def front() -> AsyncIterator[Front]:
        recorder = Recorder()
        app = GrpcApp(
            example_rpcs(recorder),
            max_receive_bytes=limits.grpc_max_receive_bytes,
            max_send_bytes=limits.grpc_max_send_bytes,
            max_concurrent_rpcs=limits.grpc_max_concurrent_rpcs,
        )
        with bind_socket("127.0.0.1", 0) as sock:
            async with serve_grpc_front(app, sock, limits, drain_timeout_s=drain_timeout_s) as port:
                yield Front(port, recorder, app)

    with on_loop_thread(
        front,
        what="the front end",
        start_timeout_s=START_TIMEOUT_S,
        stop_timeout_s=STOP_TIMEOUT_S,
    ) as (started, _):
        yield started


def call(address: str, method: str, payload: bytes, **options: object) -> bytes:
    """One unary call with grpcio's client."""
    with grpc.insecure_channel(address) as channel:
        unary: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(f"/t.Test/{method}")
        options.setdefault("timeout", 60.0)
        return unary(payload, **options)  # type: ignore[arg-type]


def unary(channel: grpc.Channel, method: str) -> grpc.UnaryUnaryMultiCallable[bytes, bytes]:
    """A test method as a unary callable on ``channel``."""
    return channel.unary_unary(f"/t.Test/{method}")


def stream(channel: grpc.Channel, method: str) -> grpc.StreamStreamMultiCallable[bytes, bytes]:
    """A test method as a streaming callable on ``channel``."""
    return channel.stream_stream(f"/t.Test/{method}")
