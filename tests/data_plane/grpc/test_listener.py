"""The gRPC listener as `foundation.serving` runs it: started over a core's handlers on the
port its settings name, refusing a port in use, and draining a call in flight on exit."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import numpy as np
import pytest

from data_plane.grpc.server import check_port, grpc_listener
from foundation.proto import grpc_service_pb2 as pb
from foundation.serving import ServerStartError
from tests.data_plane.grpc.serving import limits_under_test
from tests.data_plane.server_app import data_plane_core
from tests.models import write_onnx_add_sub
from tests.triton_oracle import free_ports

pytestmark = pytest.mark.anyio
CALL_TIMEOUT_S = 60.0


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_onnx_add_sub(tmp_path / "repo", "add_sub", dims=(4,), max_batch_size=8)
    return tmp_path / "repo"


def infer_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(np.ones(4, dtype=np.float32).tobytes())
    return request


async def test_serves_on_its_port_until_left(repo: Path, tmp_path: Path) -> None:
    [port] = free_ports(1)
    async with data_plane_core(repo, tmp_path / "cache", load_models=("add_sub",)) as core:
        async with grpc_listener(
            lambda: core.handlers,
            limits_under_test(),
            host="127.0.0.1",
            port=port,
            drain_timeout_s=5.0,
        ) as bound:
            assert bound == port
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                infer = channel.unary_unary(
                    "/inference.GRPCInferenceService/ModelInfer",
                    request_serializer=pb.ModelInferRequest.SerializeToString,
                    response_deserializer=pb.ModelInferResponse.FromString,
                )
                answer = await infer(infer_request(), timeout=CALL_TIMEOUT_S)
                assert answer.model_name == "add_sub"
        # Stopped: the port is free again and nothing answers there.
        check_port("127.0.0.1", port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            live = channel.unary_unary(
                "/inference.GRPCInferenceService/ServerLive",
                request_serializer=pb.ServerLiveRequest.SerializeToString,
                response_deserializer=pb.ServerLiveResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await live(pb.ServerLiveRequest(), timeout=2.0)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_port_in_use_is_refused(repo: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            check_port("127.0.0.1", port)
        async with data_plane_core(repo, tmp_path / "cache") as core:
            with pytest.raises(ServerStartError, match="the gRPC server did not start"):
                async with grpc_listener(
                    lambda: core.handlers,
                    limits_under_test(),
                    host="127.0.0.1",
                    port=port,
                    drain_timeout_s=1.0,
                ):
                    pass


async def test_leaving_lets_a_call_in_flight_finish(repo: Path, tmp_path: Path) -> None:
    [port] = free_ports(1)
    address = f"127.0.0.1:{port}"
    async with data_plane_core(repo, tmp_path / "cache", load_models=("add_sub",)) as core:
        started, leave = asyncio.Event(), asyncio.Event()

        async def listen() -> None:
            async with grpc_listener(
                lambda: core.handlers,
                limits_under_test(),
                host="127.0.0.1",
                port=port,
                drain_timeout_s=30.0,
            ):
                started.set()
                await leave.wait()

        listener = asyncio.create_task(listen())
        await asyncio.wait_for(started.wait(), CALL_TIMEOUT_S)
        async with grpc.aio.insecure_channel(address) as channel:
            stream = channel.stream_stream(
                "/inference.GRPCInferenceService/ModelStreamInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelStreamInferResponse.FromString,
            )
            call = stream()
            await call.write(infer_request())
            first = await call.read()
            assert isinstance(first, pb.ModelStreamInferResponse)
            assert first.error_message == ""
            leave.set()
            await asyncio.wait_for(refused_new_calls(address), CALL_TIMEOUT_S)
            # Stopping: new calls are refused, but the open stream is still served.
            await call.write(infer_request())
            second = await call.read()
            assert isinstance(second, pb.ModelStreamInferResponse)
            assert second.error_message == ""
            await call.done_writing()
            assert await call.code() == grpc.StatusCode.OK
        await asyncio.wait_for(listener, CALL_TIMEOUT_S)


async def refused_new_calls(address: str) -> None:
    """Return once a new call to ``address`` is refused."""
    while True:
        async with grpc.aio.insecure_channel(address) as channel:
            live = channel.unary_unary(
                "/inference.GRPCInferenceService/ServerLive",
                request_serializer=pb.ServerLiveRequest.SerializeToString,
                response_deserializer=pb.ServerLiveResponse.FromString,
            )
            try:
                await live(pb.ServerLiveRequest(), timeout=2.0)
            except grpc.aio.AioRpcError:
                return
        await asyncio.sleep(0.05)
