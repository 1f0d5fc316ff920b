"""``zeroserve up --grpc-port`` end to end with Triton's own gRPC client: the activator's gRPC
endpoint in front of real local workers serving real models, from zero; and the standalone
``zeroserve activator --grpc-port`` of cluster mode, beside a control plane on Redis.

The platform is a ``python -m zeroserve.cli up`` subprocess on free ports (started and
stopped as in ``test_platform_e2e``; the cluster's processes as in
``test_cluster_mode_e2e``); models are registered through the admin API scaled to zero, so
every test's first request finds its model at zero replicas. Nothing here asserts a
duration; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from foundation.proto import grpc_service_pb2 as pb
from tests.control_plane.store.conftest import start_redis_server
from tests.data_plane.sequence.models import write_onnx_accumulator
from tests.integration.conftest import free_port
from tests.integration.test_cluster_mode_e2e import (
    Cluster,
    eventually,
    is_acting,
    register as register_in_cluster,
    wait_started,
)
from tests.integration.test_platform_e2e import (
    AUTH,
    SIZES,
    SLOW_MODEL,
    Platform,
    admin_get,
    eventually as platform_eventually,
    mlp_input,
    register,
    start_platform,
    worker_pid_of,
)
from tests.models import load_mlp_weights, mlp_reference, write_onnx_mlp, write_python_model

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

REQUEST_TIMEOUT_S = 90.0
"""Each call's deadline: far above a cold start here, reached only when something hangs."""


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Platform, str]]:
    """One ``zeroserve up --grpc-port`` for the tests (each uses its own models), and the
    address of its gRPC endpoint."""
    grpc_port = free_port()
    tmp_path = tmp_path_factory.mktemp("grpc-platform")
    started = start_platform(tmp_path, "grpc", "--grpc-port", str(grpc_port))
    try:
        yield started, f"127.0.0.1:{grpc_port}"
    finally:
        started.stop()
        leftovers = started.wait_workers_gone()
        started.kill_leftovers()
        assert not leftovers, f"orphan workers {leftovers}"


@pytest.fixture
async def admin() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        yield client


def _inputs(x: np.ndarray, module: Any = grpcclient) -> list[Any]:
    tensor = module.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


def _expect(model_dir: Path, x: np.ndarray, output: np.ndarray | None) -> None:
    assert output is not None
    expected = mlp_reference(load_mlp_weights(model_dir), x)
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-5)


async def _activations(admin: httpx.AsyncClient, platform: Platform, model: str) -> int:
    return len((await admin_get(admin, platform, f"/models/{model}/activations"))["activations"])


async def test_infer_and_metadata_from_zero_with_tritonclient(
    platform: tuple[Platform, str], admin: httpx.AsyncClient
) -> None:
    up, address = platform
    model_dir = write_onnx_mlp(up.models_dir, "g_infer", SIZES, seed=11)
    await register(admin, up, model_dir)
    client = grpcclient.InferenceServerClient(address)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.get_server_metadata().name == "triton"
        assert client.is_model_ready("g_infer")  # registered: servable, not woken
        assert await _activations(admin, up, "g_infer") == 0
        x = mlp_input(11)
        result = await asyncio.to_thread(
            client.infer, "g_infer", _inputs(x), client_timeout=REQUEST_TIMEOUT_S
        )
        _expect(model_dir, x, result.as_numpy("OUTPUT0"))
        metadata = client.get_model_metadata("g_infer")
        assert metadata.name == "g_infer"
        assert [i.name for i in metadata.inputs] == ["INPUT0"]
        assert client.get_model_config("g_infer").config.max_batch_size == 8
        stats = client.get_inference_statistics("g_infer")
        assert stats.model_stats[0].inference_stats.success.count >= 1
    finally:
        client.close()


async def test_a_stream_from_zero_passes_every_request(
    platform: tuple[Platform, str], admin: httpx.AsyncClient
) -> None:
    up, address = platform
    model_dir = write_onnx_mlp(up.models_dir, "g_stream", SIZES, seed=12)
    await register(admin, up, model_dir)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(address)
    inputs = [mlp_input(1200 + i) for i in range(20)]
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        for i, x in enumerate(inputs):
            client.async_stream_infer("g_stream", _inputs(x), request_id=str(i))
        answers = {}
        for _ in inputs:
            result, error = await asyncio.to_thread(results.get, timeout=REQUEST_TIMEOUT_S)
            assert error is None, error
            answers[result.get_response().id] = result.as_numpy("OUTPUT0")
        client.stop_stream()
    finally:
        client.close()
    assert sorted(answers, key=int) == [str(i) for i in range(20)]
    for i, x in enumerate(inputs):
        _expect(model_dir, x, answers[str(i)])
    assert await _activations(admin, up, "g_stream") == 1


async def test_200_concurrent_calls_from_zero_all_correct_with_one_activation(
    platform: tuple[Platform, str], admin: httpx.AsyncClient
) -> None:
    up, address = platform
    model_dir = write_onnx_mlp(up.models_dir, "g_burst", SIZES, seed=13)
    await register(admin, up, model_dir, max_replicas=1)
    inputs = [mlp_input(1300 + i) for i in range(200)]
    async with aioclient.InferenceServerClient(address) as client:
        results = await asyncio.gather(
            *(
                client.infer(
                    "g_burst",
                    _inputs(x, aioclient),
                    request_id=str(i),
                    client_timeout=REQUEST_TIMEOUT_S,
                )
                for i, x in enumerate(inputs)
            )
        )
    for i, (x, result) in enumerate(zip(inputs, results, strict=True)):
        assert result.get_response().id == str(i)
        _expect(model_dir, x, result.as_numpy("OUTPUT0"))
    assert await _activations(admin, up, "g_burst") == 1


async def test_an_unknown_model_is_not_found(platform: tuple[Platform, str]) -> None:
    _, address = platform
    client = grpcclient.InferenceServerClient(address)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("nope", _inputs(mlp_input(0)), client_timeout=REQUEST_TIMEOUT_S)
        assert not client.is_model_ready("nope")
    finally:
        client.close()
    assert caught.value.status() == "StatusCode.NOT_FOUND"
    assert caught.value.message() == "Request for unknown model: 'nope' is not found"


async def test_repository_control_points_to_the_admin_api(platform: tuple[Platform, str]) -> None:
    _, address = platform
    client = grpcclient.InferenceServerClient(address)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("anything")
    finally:
        client.close()
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "admin API" in (caught.value.message() or "")


async def test_a_full_buffer_is_unavailable_with_a_retry_hint(
    tmp_path: Path, admin: httpx.AsyncClient
) -> None:
    grpc_port = free_port()
    up = start_platform(
        tmp_path,
        "small-buffer",
        "--grpc-port",
        str(grpc_port),
        ZEROSERVE_ACTIVATOR_BUFFER_MAX_REQUESTS="2",
    )
    try:
        # A model whose load takes seconds: the calls wait for it in the buffer meanwhile.
        await register(admin, up, write_python_model(up.models_dir, "slow", SLOW_MODEL, dims=(4,)))
        request = pb.ModelInferRequest(model_name="slow")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            infer = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            outcomes = await asyncio.gather(
                *(infer(request, timeout=REQUEST_TIMEOUT_S) for _ in range(12)),
                return_exceptions=True,
            )
    finally:
        up.stop()
        up.wait_workers_gone()
        up.kill_leftovers()
    answered = [o for o in outcomes if isinstance(o, pb.ModelInferResponse)]
    refused = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
    assert len(answered) + len(refused) == len(outcomes), outcomes
    assert answered and refused
    for response in answered:
        assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [2.0] * 4
    for error in refused:
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert "request buffer is full" in (error.details() or "")
        assert dict(error.trailing_metadata() or ())["retry-after"] == "1"


async def test_a_killed_worker_gives_clear_errors_and_nothing_hangs(
    platform: tuple[Platform, str], admin: httpx.AsyncClient
) -> None:
    up, address = platform
    model_dir = write_onnx_mlp(up.models_dir, "g_victim", SIZES, seed=14)
    await register(admin, up, model_dir)
    async with aioclient.InferenceServerClient(address) as client:
        x = mlp_input(14)
        first = await client.infer("g_victim", _inputs(x, aioclient))
        _expect(model_dir, x, first.as_numpy("OUTPUT0"))
        pid = await worker_pid_of(admin, up, "g_victim")
        up.remember_workers()
        stop = asyncio.Event()
        failures: list[str] = []
        answered = 0

        async def traffic(seed: int) -> None:
            nonlocal answered
            i = 0
            while not stop.is_set():
                i += 1
                x = mlp_input(seed * 10_000 + i)
                try:
                    result = await client.infer(
                        "g_victim", _inputs(x, aioclient), client_timeout=REQUEST_TIMEOUT_S
                    )
                except InferenceServerException as exc:
                    # Clear errors only: the activator's, naming the model, never a hang
                    # (the client's deadline would be DEADLINE_EXCEEDED).
                    assert exc.status() == "StatusCode.UNAVAILABLE", exc
                    assert "g_victim" in (exc.message() or ""), exc
                    failures.append(exc.message() or "")
                else:
                    _expect(model_dir, x, result.as_numpy("OUTPUT0"))
                    answered += 1

        async def kill() -> None:
            await asyncio.sleep(1.0)
            os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(3.0)
            stop.set()

        await asyncio.gather(*(traffic(s) for s in range(6)), kill())
        assert answered > 0
        x = mlp_input(15)
        after = await client.infer("g_victim", _inputs(x, aioclient))
        _expect(model_dir, x, after.as_numpy("OUTPUT0"))
    assert await worker_pid_of(admin, up, "g_victim") != pid


async def test_a_standalone_activator_serves_grpc_from_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, admin: httpx.AsyncClient
) -> None:
    grpc_port = free_port()
    redis = start_redis_server(tmp_path, persistent=False)
    cluster = Cluster(tmp_path, redis)
    try:
        control_plane = cluster.start_control_plane("control-plane")
        # The cluster helper starts activators with this process's environment (and its own).
        monkeypatch.setenv("ZEROSERVE_ACTIVATOR_GRPC_PORT", str(grpc_port))
        activator = cluster.start_activator("activator")
        await wait_started(admin, cluster, control_plane, activator)
        await eventually(lambda: is_acting(admin, control_plane), "the lease", cluster)
        model_dir = await register_in_cluster(admin, control_plane, cluster, "c_grpc", seed=21)
        inputs = [mlp_input(2100 + i) for i in range(20)]
        async with aioclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
            assert await client.is_server_ready()
            results = await asyncio.gather(
                *(
                    client.infer("c_grpc", _inputs(x, aioclient), client_timeout=REQUEST_TIMEOUT_S)
                    for x in inputs
                )
            )
        for x, result in zip(inputs, results, strict=True):
            _expect(model_dir, x, result.as_numpy("OUTPUT0"))
        activations = await admin.get(
            f"{control_plane.url}/admin/v1/models/c_grpc/activations", headers=AUTH
        )
        assert len(activations.json()["activations"]) == 1
    finally:
        orphans = cluster.close()
        redis.stop()
    assert not orphans, f"workers outlived their control plane: {orphans}"


def _acc_input(value: int, module: Any = grpcclient) -> list[Any]:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return [tensor]


async def test_sequences_stick_to_their_replica_over_grpc(
    platform: tuple[Platform, str], admin: httpx.AsyncClient
) -> None:
    """Two replicas of the ONNX accumulator: interleaved sequences over unary ModelInfer and
    over one stream each keep their running sum, which only holds if every step reaches the
    replica holding the sequence's state (the other answers that START is missing)."""
    up, address = platform
    # Eight slots per replica: every sequence gets one at once (a backlogged one would wait
    # for another to end).
    model_dir = write_onnx_accumulator(up.models_dir, "g_acc", max_batch_size=8, idle_us=60_000_000)
    await register(admin, up, model_dir, min_replicas=2, max_replicas=2)

    async def two_replicas() -> bool:
        workers = (await admin_get(admin, up, "/workers"))["workers"]
        return sum("g_acc" in w["models"] for w in workers) == 2

    await platform_eventually(two_replicas, "two replicas of g_acc", up)
    ids: list[int | str] = [*range(1, 5), *(f"g-{n}" for n in range(4))]
    client = aioclient.InferenceServerClient(address)
    try:
        sums = dict.fromkeys(ids, 0)
        for step in range(3):
            results = await asyncio.gather(
                *(
                    client.infer(
                        "g_acc",
                        _acc_input(index + 1, aioclient),
                        sequence_id=cid,
                        sequence_start=step == 0,
                        sequence_end=step == 2,
                        client_timeout=REQUEST_TIMEOUT_S,
                    )
                    for index, cid in enumerate(ids)
                )
            )
            for index, (cid, result) in enumerate(zip(ids, results, strict=True)):
                sums[cid] += index + 1
                assert int(result.as_numpy("OUTPUT").item()) == sums[cid], (cid, step)
    finally:
        await client.close()

    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    stream_client = grpcclient.InferenceServerClient(address)
    try:
        stream_client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for step in range(3):
            for index, cid in enumerate(ids):
                stream_client.async_stream_infer(
                    "g_acc",
                    _acc_input(10 * (index + 1)),
                    request_id=f"{cid}/{step}",
                    sequence_id=cid,
                    sequence_start=step == 0,
                    sequence_end=step == 2,
                )
        got: dict[str, int] = {}
        for _ in range(3 * len(ids)):
            result, error = await asyncio.to_thread(answers.get, timeout=REQUEST_TIMEOUT_S)
            assert error is None, error
            got[result.get_response().id] = int(result.as_numpy("OUTPUT").item())
        stream_client.stop_stream()
    finally:
        stream_client.close()
    for index, cid in enumerate(ids):
        assert [got[f"{cid}/{step}"] for step in range(3)] == [
            10 * (index + 1) * (step + 1) for step in range(3)
        ]
