"""The gRPC loops against an in-process grpc.aio server whose ModelInfer answers, fails,
hangs or records what it is sent: answers, errors by status code, connections and slots.

Each level lasts a fraction of a second; only counts are asserted, never times.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from zeroserve.bench.grpc_client import INFER_METHOD, GrpcTarget, GrpcTargetError, grpc_frame
from zeroserve.bench.grpc_loops import GrpcClosedLoop, GrpcLoadPlan, GrpcOpenLoop

pytestmark = pytest.mark.anyio

Behaviour = Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[bytes]]


class _Recorder:
    """What the server saw: request bodies and the connections (peers) they came on."""

    def __init__(self) -> None:
        self.requests: set[bytes] = set()
        self.peers: set[str] = set()


async def _ok(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    return b""


async def _invalid(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unexpected inference input 'X'")
    raise AssertionError("abort returns only by raising")


async def _hang(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    await asyncio.sleep(30)
    return b""


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, behaviour: Behaviour, recorder: _Recorder) -> None:
        self._behaviour = behaviour
        self._recorder = recorder

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        if handler_call_details.method != INFER_METHOD:
            return None

        async def infer(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            self._recorder.requests.add(request)
            self._recorder.peers.add(context.peer())
            return await self._behaviour(request, context)

        return grpc.unary_unary_rpc_method_handler(infer)


@asynccontextmanager
async def _server(behaviour: Behaviour) -> AsyncIterator[tuple[GrpcTarget, _Recorder]]:
    recorder = _Recorder()
    server = grpc.aio.server(handlers=[_Handler(behaviour, recorder)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield GrpcTarget("127.0.0.1", port), recorder
    finally:
        await server.stop(grace=None)


def _plan(
    target: GrpcTarget,
    *,
    timeout_s: float = 5.0,
    streams: int = 8,
    slot_requests: tuple[tuple[bytes, ...], ...] = (),
) -> GrpcLoadPlan:
    return GrpcLoadPlan(
        target=target,
        requests=(b"request",),
        warmup_s=0.0,
        duration_s=0.3,
        timeout_s=timeout_s,
        streams_per_connection=streams,
        slot_requests=slot_requests,
    )


async def test_closed_loop_spreads_calls_over_connections():
    async with _server(_ok) as (target, recorder):
        result = await GrpcClosedLoop(_plan(target, streams=2), 5).run()
    assert result.ok > 0 and result.errors == {}
    assert result.latency.count == result.ok
    # Five calls at once, two per connection at most: three connections.
    assert result.connections == 3 and len(recorder.peers) == 3
    assert recorder.requests == {b"request"}


@pytest.mark.parametrize(
    ("behaviour", "kind", "sample"),
    [
        pytest.param(_invalid, "grpc_invalid_argument", "unexpected inference", id="status"),
        pytest.param(_hang, "grpc_deadline_exceeded", "", id="past the timeout"),
    ],
)
async def test_closed_loop_counts_errors_by_status_code(behaviour, kind, sample):
    async with _server(behaviour) as (target, _):
        result = await GrpcClosedLoop(_plan(target, timeout_s=0.1), 2).run()
    assert result.ok == 0 and set(result.errors) == {kind}
    assert sample in result.error_samples[kind]


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_nobody_listening_is_unavailable():
    target = GrpcTarget("127.0.0.1", _unused_port())
    result = await GrpcClosedLoop(_plan(target), 2).run()
    assert result.ok == 0 and set(result.errors) == {"grpc_unavailable"}
    result = await GrpcOpenLoop(_plan(target), 100.0, seed=0, max_in_flight=4).run()
    scheduled = round((result.offered_rate or 0) * result.duration_s)
    assert result.ok == 0 and result.errors == {"grpc_unavailable": scheduled}


async def test_open_loop_answers_and_accounts_for_every_call():
    async with _server(_ok) as (target, _):
        result = await GrpcOpenLoop(_plan(target), 200.0, seed=1, max_in_flight=8).run()
    assert result.ok > 0 and result.errors == {}
    assert result.service_latency is not None and result.service_latency.count == result.ok
    async with _server(_hang) as (target, _):
        result = await GrpcOpenLoop(
            _plan(target, timeout_s=0.1), 100.0, seed=2, max_in_flight=2
        ).run()
    scheduled = round((result.offered_rate or 0) * result.duration_s)
    assert result.ok + result.error_count == scheduled
    assert set(result.errors) <= {"grpc_deadline_exceeded", "timeout"}


async def test_each_slot_sends_its_own_requests():
    table = ((b"slot0",), (b"slot1",), (b"slot2",))
    async with _server(_ok) as (target, recorder):
        plan = _plan(target, slot_requests=table)
        result = await GrpcClosedLoop(plan, 3).run()
        assert result.ok > 0 and recorder.requests == {b"slot0", b"slot1", b"slot2"}
        with pytest.raises(ValueError, match="4 slots asked"):
            GrpcClosedLoop(plan, 4)
        recorder.requests.clear()
        result = await GrpcOpenLoop(plan, 300.0, seed=3, max_in_flight=64).run()
    assert result.ok > 0 and recorder.requests <= {b"slot0", b"slot1", b"slot2"}


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("127.0.0.1:8001", GrpcTarget("127.0.0.1", 8001)),
        ("grpc://localhost:9", GrpcTarget("localhost", 9)),
        ("example.test", GrpcTarget("example.test", 8001)),
        ("[::1]:50051", GrpcTarget("::1", 50051)),
    ],
)
def test_targets(text, target):
    assert GrpcTarget.parse(text) == target
    assert GrpcTarget.parse(target.address) == target


@pytest.mark.parametrize("text", ["http://h:8001", "h:port", "h:0", "", "h:1:2"])
def test_bad_targets(text):
    with pytest.raises(GrpcTargetError):
        GrpcTarget.parse(text)


def test_grpc_frame():
    assert grpc_frame(b"abc") == b"\x00\x00\x00\x00\x03abc"
