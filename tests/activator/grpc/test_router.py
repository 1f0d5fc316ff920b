"""The activator's gRPC router in process: what it answers itself, how it refuses, and how
unary calls reach replicas (buffered at zero, one activation, least outstanding, retries,
worker failures, cancellation, deadlines, metadata, channels)."""

from __future__ import annotations

import asyncio
import collections
import socket

import grpc
import pytest

from activator.app import create_app_on
from foundation.grpc_front.web import is_grpc_web
from foundation.proto import grpc_service_pb2 as pb
from foundation.records import Placement
from tests.activator.conftest import asgi_client, serve_asgi
from tests.activator.fakes import FakeStore, RecordingActivate
from tests.activator.grpc.conftest import (
    WAIT_S,
    PlaceOnActivate,
    answered_by,
    grpc_activator,
    infer_request,
    place,
    wait_until,
)
from tests.activator.grpc.fake_worker import FakeWorker

pytestmark = pytest.mark.anyio

WORKER_PROTOCOLS = pytest.mark.parametrize("protocol", ["grpc-web", "grpc"])
"""Unary calls reach workers as gRPC-Web (the default) or over gRPC channels."""


def _named(worker: FakeWorker, protocol: str) -> str:
    """How the activator's errors name ``worker``: by the address the call went to."""
    return worker.url if protocol == "grpc-web" else worker.address


def _dead_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


async def test_health_and_server_metadata_are_the_activators() -> None:
    async with grpc_activator(FakeStore(), RecordingActivate()) as client:
        live = await client.unary("ServerLive", pb.ServerLiveResponse)(pb.ServerLiveRequest())
        ready = await client.unary("ServerReady", pb.ServerReadyResponse)(pb.ServerReadyRequest())
        meta = await client.unary("ServerMetadata", pb.ServerMetadataResponse)(
            pb.ServerMetadataRequest()
        )
        assert live.live and ready.ready
        assert meta.name == "triton"
        assert "binary_tensor_data" in meta.extensions
        assert "model_repository" not in meta.extensions
        client.core.lifecycle.is_stopping = True
        ready = await client.unary("ServerReady", pb.ServerReadyResponse)(pb.ServerReadyRequest())
        assert not ready.ready


async def test_model_ready_answers_from_the_catalog_without_waking_the_model() -> None:
    store = FakeStore()
    store.register("m")
    activate = RecordingActivate()
    async with grpc_activator(store, activate) as client:
        ready = client.unary("ModelReady", pb.ModelReadyResponse)
        assert (await ready(pb.ModelReadyRequest(name="m"))).ready
        assert not (await ready(pb.ModelReadyRequest(name="nope"))).ready
    assert activate.calls == []


@pytest.mark.parametrize(
    ("rpc", "request_message"),
    [
        pytest.param("ModelInfer", infer_request("nope"), id="infer"),
        pytest.param("ModelMetadata", pb.ModelMetadataRequest(name="nope"), id="metadata"),
        pytest.param("ModelConfig", pb.ModelConfigRequest(name="nope"), id="config"),
        pytest.param("ModelStatistics", pb.ModelStatisticsRequest(name="nope"), id="statistics"),
    ],
)
async def test_an_unregistered_model_is_not_found_with_tritons_text(
    rpc: str, request_message: object
) -> None:
    activate = RecordingActivate()
    async with grpc_activator(FakeStore(), activate) as client:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.unary(rpc, pb.ModelInferResponse)(request_message)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == "Request for unknown model: 'nope' is not found"
    assert activate.calls == []


@pytest.mark.parametrize(
    ("rpc", "request_message", "pointer"),
    [
        pytest.param("RepositoryIndex", pb.RepositoryIndexRequest(), "admin API", id="index"),
        pytest.param(
            "RepositoryModelLoad",
            pb.RepositoryModelLoadRequest(model_name="m"),
            "/admin/v1/models/<name>/load",
            id="load",
        ),
        pytest.param(
            "RepositoryModelUnload",
            pb.RepositoryModelUnloadRequest(model_name="m"),
            "admin API",
            id="unload",
        ),
        pytest.param(
            "SystemSharedMemoryRegister",
            pb.SystemSharedMemoryRegisterRequest(name="r", key="/k", byte_size=8),
            "shared memory",
            id="system-shm",
        ),
        pytest.param(
            "CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest(), "shared memory", id="cuda"
        ),
        pytest.param("TraceSetting", pb.TraceSettingRequest(), "each worker", id="trace"),
        pytest.param("LogSettings", pb.LogSettingsRequest(), "each worker", id="log"),
        pytest.param(
            "ModelStatistics", pb.ModelStatisticsRequest(), "one model by name", id="all-stats"
        ),
    ],
)
async def test_operations_that_are_not_the_activators_are_unimplemented(
    rpc: str, request_message: object, pointer: str
) -> None:
    async with grpc_activator(FakeStore(), RecordingActivate()) as client:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.unary(rpc, pb.RepositoryIndexResponse)(request_message)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert pointer in (caught.value.details() or "")


@pytest.mark.parametrize("rpc", ["ModelInfer", "ModelMetadata", "ServerLive", "ModelReady"])
async def test_bytes_that_are_no_request_get_tritons_parse_error(rpc: str) -> None:
    async with grpc_activator(FakeStore(), RecordingActivate()) as client:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.raw(rpc)(b"\x0a\x05ab")  # field 1 claims 5 bytes, has 2
        assert caught.value.code() == grpc.StatusCode.INTERNAL
        assert caught.value.details() == "Unable to parse request"
        # The listener keeps serving.
        live = await client.unary("ServerLive", pb.ServerLiveResponse)(pb.ServerLiveRequest())
        assert live.live


async def test_calls_at_zero_wait_for_one_activation_and_all_get_their_answer() -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        gate = asyncio.Event()
        activate = PlaceOnActivate(store, [worker], gate=gate)
        async with grpc_activator(store, activate) as client:
            calls = [
                asyncio.ensure_future(
                    client.infer("m", request_id=str(i), payload=i.to_bytes(4, "little"))
                )
                for i in range(50)
            ]
            await asyncio.wait_for(activate.called.wait(), WAIT_S)
            await wait_until(lambda: client.core.parts.buffer.waiting("m") == 50)
            gate.set()
            responses = await asyncio.wait_for(asyncio.gather(*calls), WAIT_S)
            first = await asyncio.wait_for(store.wait_for_first_response(), WAIT_S)
    assert activate.calls == ["m"]
    for i, response in enumerate(responses):
        assert response.id == str(i)
        assert response.model_name == "m"
        assert response.raw_output_contents[0] == i.to_bytes(4, "little")
    assert first.worker_id == "w1"


@WORKER_PROTOCOLS
async def test_requests_go_to_the_replica_with_fewest_in_flight(protocol: str) -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as w1, FakeWorker("w2") as w2:
        w1.hold, w2.hold = asyncio.Event(), asyncio.Event()
        async with grpc_activator(
            store, RecordingActivate(), grpc_worker_protocol=protocol
        ) as client:
            await place(store, "m", w1)
            await place(store, "m", w2)
            await wait_until(lambda: len(client.core.parts.table.replicas("m")) == 2)
            calls = [asyncio.ensure_future(client.infer("m")) for _ in range(10)]
            await wait_until(lambda: w1.active + w2.active == 10)
            assert (w1.active, w2.active) == (5, 5)
            w1.hold.set()
            w2.hold.set()
            responses = await asyncio.wait_for(asyncio.gather(*calls), WAIT_S)
    assert collections.Counter(answered_by(r) for r in responses) == {"w1": 5, "w2": 5}


@WORKER_PROTOCOLS
async def test_metadata_config_and_statistics_pass_through(protocol: str) -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        async with grpc_activator(
            store, PlaceOnActivate(store, [worker]), grpc_worker_protocol=protocol
        ) as client:
            meta = await client.unary("ModelMetadata", pb.ModelMetadataResponse)(
                pb.ModelMetadataRequest(name="m")
            )
            config = await client.unary("ModelConfig", pb.ModelConfigResponse)(
                pb.ModelConfigRequest(name="m")
            )
            stats = await client.unary("ModelStatistics", pb.ModelStatisticsResponse)(
                pb.ModelStatisticsRequest(name="m")
            )
    assert (meta.name, meta.platform) == ("m", "fake:w1")
    assert (config.config.name, config.config.max_batch_size) == ("m", 8)
    assert stats.model_stats[0].inference_count == 7


async def test_a_full_buffer_is_unavailable_with_a_retry_hint() -> None:
    store = FakeStore()
    store.register("m")
    activate = RecordingActivate(gate=asyncio.Event())  # never places the model
    async with grpc_activator(store, activate, buffer_max_requests=2, retry_after_s=3) as client:
        waiting = [asyncio.ensure_future(client.infer("m")) for _ in range(2)]
        await wait_until(lambda: client.core.parts.buffer.waiting("m") == 2)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.infer("m")
        for call in waiting:
            call.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        await wait_until(lambda: client.core.parts.buffer.waiting("m") == 0)
    error = caught.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "request buffer is full (2 requests waiting)" in (error.details() or "")
    trailers = dict(error.trailing_metadata() or ())
    assert trailers["retry-after"] == "3"
    assert trailers["grpc-retry-pushback-ms"] == "3000"
    assert activate.calls == ["m"]


async def test_an_activation_that_never_comes_times_out_unavailable() -> None:
    store = FakeStore()
    store.register("m")
    activate = RecordingActivate()  # returns, but nothing is ever placed
    async with grpc_activator(store, activate, activation_timeout_s=0.2) as client:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.infer("m", timeout=WAIT_S)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details() == "model 'm' did not become ready within 0.2 s"
    assert dict(caught.value.trailing_metadata() or ())["retry-after"] == "1"


async def test_a_failed_activation_fails_its_burst_unavailable() -> None:
    store = FakeStore()
    store.register("m")
    activate = RecordingActivate(error=RuntimeError("no capacity"))
    async with grpc_activator(store, activate) as client:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.infer("m", timeout=WAIT_S)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details() == "model 'm' could not be activated: no capacity"


@WORKER_PROTOCOLS
async def test_a_replica_that_refuses_the_connection_is_skipped_and_the_call_retried(
    protocol: str,
) -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("live") as worker:
        async with grpc_activator(
            store, RecordingActivate(), grpc_worker_protocol=protocol
        ) as client:
            await place(store, "m", _dead_address(), worker_id="dead")
            await place(store, "m", worker)
            await wait_until(lambda: len(client.core.parts.table.replicas("m")) == 2)
            responses = [await client.infer("m", timeout=WAIT_S) for _ in range(4)]
            routed = [r.worker_id for r in client.core.parts.table.replicas("m")]
    assert {answered_by(r) for r in responses} == {"live"}
    assert routed == ["live"]


async def test_a_worker_without_grpc_is_unavailable() -> None:
    store = FakeStore()
    store.register("m")
    async with grpc_activator(store, RecordingActivate()) as client:
        await place(store, "m", "", worker_id="http-only")
        await wait_until(lambda: len(client.core.parts.table.replicas("m")) == 1)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.infer("m", timeout=WAIT_S)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details() == "model 'm': worker http-only serves no gRPC"


@WORKER_PROTOCOLS
async def test_the_workers_own_errors_pass_through_unchanged(protocol: str) -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        worker.error = (grpc.StatusCode.INVALID_ARGUMENT, "unexpected inference input 'X'")
        async with grpc_activator(
            store, PlaceOnActivate(store, [worker]), grpc_worker_protocol=protocol
        ) as client:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await client.infer("m", timeout=WAIT_S)
            # The failure does not count against the replica: the next call is answered.
            worker.error = None
            assert (await client.infer("m", request_id="again")).id == "again"
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "unexpected inference input 'X'"


@WORKER_PROTOCOLS
async def test_a_worker_that_dies_mid_call_gives_a_clear_unavailable(protocol: str) -> None:
    store = FakeStore()
    store.register("m")
    worker = FakeWorker("w1")
    async with worker:
        worker.hold = asyncio.Event()
        async with grpc_activator(
            store, PlaceOnActivate(store, [worker]), grpc_worker_protocol=protocol
        ) as client:
            call = asyncio.ensure_future(client.infer("m", timeout=WAIT_S))
            await asyncio.wait_for(worker.started.wait(), WAIT_S)
            await worker.stop(None)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            replica = client.core.parts.table.replicas("m")[0]
            assert (replica.in_flight, replica.awaiting_head) == (0, 0)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert f"model 'm': worker {_named(worker, protocol)} failed:" in (caught.value.details() or "")


@WORKER_PROTOCOLS
async def test_a_client_that_cancels_cancels_the_workers_call(protocol: str) -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        worker.hold = asyncio.Event()
        async with grpc_activator(
            store, PlaceOnActivate(store, [worker]), grpc_worker_protocol=protocol
        ) as client:
            call = client.unary("ModelInfer", pb.ModelInferResponse)(infer_request("m"))
            await asyncio.wait_for(worker.started.wait(), WAIT_S)
            call.cancel()
            await wait_until(lambda: worker.cancelled == 1)
            await wait_until(lambda: client.core.parts.traffic.in_flight("m") == 0)
            replica = client.core.parts.table.replicas("m")[0]
            await wait_until(lambda: replica.in_flight == 0)


async def test_a_client_that_leaves_while_buffered_gives_its_place_up() -> None:
    store = FakeStore()
    store.register("m")
    activate = RecordingActivate(gate=asyncio.Event())
    async with grpc_activator(store, activate) as client:
        call = client.unary("ModelInfer", pb.ModelInferResponse)(infer_request("m"))
        await wait_until(lambda: client.core.parts.buffer.waiting("m") == 1)
        call.cancel()
        await wait_until(lambda: client.core.parts.buffer.waiting("m") == 0)
        await wait_until(lambda: client.core.parts.traffic.in_flight("m") == 0)


@WORKER_PROTOCOLS
async def test_the_workers_deadline_is_the_clients_bounded_by_the_read_timeout(
    protocol: str,
) -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        activate = PlaceOnActivate(store, [worker])
        async with grpc_activator(
            store, activate, upstream_read_timeout_s=20.0, grpc_worker_protocol=protocol
        ) as client:
            await client.infer("m")
            await client.infer("m", timeout=5.0)
    unbounded, bounded = worker.timeouts
    # gRPC carries deadlines in units it rounds up: a little over 20 s and 5 s.
    assert unbounded is not None and 10.0 < unbounded <= 21.0
    assert bounded is not None and bounded <= 6.0


@WORKER_PROTOCOLS
async def test_a_worker_slower_than_the_read_timeout_is_deadline_exceeded(protocol: str) -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        worker.hold = asyncio.Event()
        activate = PlaceOnActivate(store, [worker])
        async with grpc_activator(
            store, activate, upstream_read_timeout_s=0.3, grpc_worker_protocol=protocol
        ) as client:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await client.infer("m", timeout=WAIT_S)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert caught.value.details() == (
        f"model 'm': worker {_named(worker, protocol)} did not answer within 0.3 s"
    )


@WORKER_PROTOCOLS
async def test_the_clients_metadata_goes_to_the_worker(protocol: str) -> None:
    store = FakeStore()
    store.register("m")
    async with FakeWorker("w1") as worker:
        async with grpc_activator(
            store, PlaceOnActivate(store, [worker]), grpc_worker_protocol=protocol
        ) as client:
            await client.infer("m", metadata=(("x-request-id", "abc"),))
    assert worker.metadata[0]["x-request-id"] == "abc"


async def test_one_channel_per_worker_closed_when_the_worker_leaves() -> None:
    store = FakeStore()
    store.register("m")
    store.register("n")
    async with FakeWorker("w1") as worker:
        async with grpc_activator(
            store, RecordingActivate(), grpc_worker_protocol="grpc"
        ) as client:
            await place(store, "m", worker)
            await place(store, "n", worker)
            await wait_until(lambda: len(client.core.parts.table.models()) == 2)
            for model in ("m", "n", "m"):
                await client.infer(model)
            assert client.listener.open_channels == 1
            await store.remove_placement("m", "w1")
            await wait_until(lambda: not client.core.parts.table.replicas("m"))
            assert client.listener.open_channels == 1  # "n" still routes there
            await store.remove_placement("n", "w1")
            await wait_until(lambda: client.listener.open_channels == 0)


@WORKER_PROTOCOLS
async def test_grpc_and_http_share_one_buffer_and_one_activation(protocol: str) -> None:
    store = FakeStore()
    store.register("m")

    async def http_worker(scope, receive, send) -> None:
        if is_grpc_web(scope):
            assert worker.web is not None
            await worker.web(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async with FakeWorker("w1") as worker, serve_asgi(http_worker) as url:
        gate = asyncio.Event()

        async def activate(model: str) -> None:
            activations.append(model)
            await gate.wait()
            await store.add_placement(
                Placement(model=model, worker_id="w1", url=url, grpc_address=worker.address)
            )

        activations: list[str] = []
        async with grpc_activator(store, activate, grpc_worker_protocol=protocol) as client:
            app = create_app_on(client.core)
            async with asgi_client(app) as http:
                grpc_call = asyncio.ensure_future(client.infer("m", timeout=WAIT_S))
                http_call = asyncio.ensure_future(
                    http.post("/v2/models/m/infer", content=b"{}", timeout=WAIT_S)
                )
                await wait_until(lambda: client.core.parts.buffer.waiting("m") == 2)
                gate.set()
                response, http_response = await asyncio.wait_for(
                    asyncio.gather(grpc_call, http_call), WAIT_S
                )
    assert activations == ["m"]
    assert answered_by(response) == "w1"
    assert http_response.status_code == 200
