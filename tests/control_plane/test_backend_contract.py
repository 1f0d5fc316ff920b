"""What every ``PodBackend`` does, run against both: ``local`` and ``knative``.

Both run real ``python -m data_plane`` workers. The local backend starts them itself; the
knative backend drives a fake Kubernetes API server over HTTP with the real ``kubernetes``
client (no API server can run here: see ``tests/control_plane/knative/fake_kube.py``), whose
stand-in kubelet runs each pod's container command, as the Knative Service built by
``backends.knative.manifests`` says, on the pod's own loopback address. Then the placer loads
a real ONNX model onto a worker of either backend the same way, and the model answers.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from control_plane.backends.base import PodBackend, PoolSpec
from control_plane.backends.local import LocalBackend, free_port
from control_plane.errors import NoCapacityError
from control_plane.placement import Placer
from control_plane.settings import ControlPlaneSettings
from control_plane.store.memory import MemoryStateStore
from control_plane.worker_client import WorkerClient
from foundation.proto import grpc_service_pb2 as pb
from foundation.records import ModelRecord, WorkerRecord
from tests.control_plane.fakes import make_settings

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

GONE_TIMEOUT_S = 30.0
KNATIVE_CONFIG = {
    ("knative-serving", "config-features"): {"kubernetes.podspec-volumes-hostpath": "enabled"},
    ("knative-serving", "config-autoscaler"): {"allow-zero-initial-scale": "true"},
    ("knative-serving", "config-defaults"): {"max-revision-timeout-seconds": "900"},
}


class Lost:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.event = asyncio.Event()

    async def __call__(self, worker_id: str) -> None:
        self.ids.append(worker_id)
        self.event.set()


def is_alive(pid: int) -> bool:
    """Running, not a zombie (a container's init may not reap reparented children)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        await asyncio.sleep(0.1)
    return False


@dataclass
class Harness:
    """A backend with its ``WorkerLost`` recorder and a way to find a worker's process."""

    backend: PodBackend
    lost: Lost
    settings: ControlPlaneSettings
    pid_of: Callable[[WorkerRecord], int | None]


def settings_for(tmp_path: Path) -> ControlPlaneSettings:
    return make_settings(
        tmp_path / "cache",
        worker_log_dir=tmp_path / "logs",
        worker_health_interval_s=0.5,
        worker_stop_timeout_s=10.0,
        allowed_storage=(str(tmp_path / "models"),),
    )


async def local_harness(tmp_path: Path, stack: AsyncExitStack) -> Harness:
    settings = settings_for(tmp_path)
    lost = Lost()
    # As the platform does: local workers learn the allow-list from their environment.
    backend = LocalBackend(
        settings,
        on_worker_lost=lost,
        repository=tmp_path / "repository",
        extra_env={"ZEROSERVE_ALLOWED_STORAGE": ",".join(settings.allowed_storage)},
    )
    stack.push_async_callback(backend.close)

    def pid_of(worker: WorkerRecord) -> int | None:
        pid = backend.details(worker.id).get("pid")
        return pid if isinstance(pid, int) else None

    return Harness(backend, lost, settings, pid_of)


async def knative_harness(tmp_path: Path, stack: AsyncExitStack) -> Harness:
    from control_plane.backends.knative.api import KubeApi
    from control_plane.backends.knative.backend import KnativeBackend
    from control_plane.backends.knative.settings import KnativeSettings
    from tests.control_plane.knative.fake_kube import FakeKube, ProcessKubelet

    kubelet = ProcessKubelet(tmp_path / "cluster")
    kube = stack.enter_context(FakeKube(kubelet=kubelet, config_maps=KNATIVE_CONFIG))
    knative = KnativeSettings(
        pod_poll_interval_s=0.05,
        container_port=free_port(),
        readiness_propagation_s=0,
    )
    settings = settings_for(tmp_path)
    lost = Lost()
    api = KubeApi(kube.api_client(), namespace=knative.namespace, request_timeout_s=5)
    backend = KnativeBackend(settings, knative, api, on_worker_lost=lost)
    stack.push_async_callback(backend.close)

    def pid_of(worker: WorkerRecord) -> int | None:
        pod = backend.details(worker.id).get("pod")
        return kubelet.pid(pod) if isinstance(pod, str) else None

    return Harness(backend, lost, settings, pid_of)


@pytest.fixture(params=["local", "knative"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    async with AsyncExitStack() as stack:
        make = local_harness if request.param == "local" else knative_harness
        found = await make(tmp_path, stack)
        await found.backend.ensure_pool(PoolSpec(name="default", max_workers=2))
        yield found


async def test_start_probe_stop(harness: Harness):
    backend, lost = harness.backend, harness.lost
    worker = await backend.start_worker("default")
    assert worker.url.startswith("http://127.0.0.")
    assert [w.id for w in backend.list_workers()] == [worker.id]
    assert await backend.health(worker.id)
    assert await _grpc_live(worker.grpc_address)
    pid = harness.pid_of(worker)
    assert pid is not None and is_alive(pid)
    await backend.stop_worker(worker.id)
    assert await wait_gone(pid)
    assert backend.list_workers() == []
    assert not await backend.health(worker.id)
    assert lost.ids == []  # a stop on purpose is no loss


async def _grpc_live(address: str) -> bool:
    """ServerLive at ``address``: the worker's gRPC server, where the record says it is."""
    assert address.startswith("127.0.0."), address
    async with grpc.aio.insecure_channel(address) as channel:
        live = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerLive",
            request_serializer=pb.ServerLiveRequest.SerializeToString,
            response_deserializer=pb.ServerLiveResponse.FromString,
        )
        response = await live(pb.ServerLiveRequest(), timeout=GONE_TIMEOUT_S)
    return bool(response.live)


async def test_pool_bound(harness: Harness):
    backend = harness.backend
    await asyncio.gather(backend.start_worker("default"), backend.start_worker("default"))
    with pytest.raises(NoCapacityError):
        await backend.start_worker("default")


async def test_a_killed_worker_is_reported_lost(harness: Harness):
    backend, lost = harness.backend, harness.lost
    worker = await backend.start_worker("default")
    pid = harness.pid_of(worker)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await asyncio.wait_for(lost.event.wait(), GONE_TIMEOUT_S)
    assert lost.ids == [worker.id]
    assert worker.id not in {w.id for w in backend.list_workers()}


async def test_the_placer_loads_a_model_onto_a_worker(harness: Harness, tmp_path: Path):
    from data_plane.demo import DEMO_MODEL, write_demo_repository

    model_dir = await asyncio.to_thread(write_demo_repository, tmp_path / "models")
    settings = harness.settings
    store = MemoryStateStore()
    workers = WorkerClient(load_timeout_s=60, unload_timeout_s=30)
    pool = PoolSpec(name="default", max_workers=2)
    placer = Placer(store, harness.backend, pool, workers, settings)
    try:
        model = ModelRecord(name=DEMO_MODEL, storage_uri=str(model_dir))
        await store.create_model(model)
        result = await placer.place(model)
        assert result.is_worker_started
        body = {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
            ]
        }
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            response = await client.post(
                f"{result.placement.url}/v2/models/{DEMO_MODEL}/infer", json=body
            )
            assert response.status_code == 200, response.text
            (output,) = response.json()["outputs"]
            assert output["name"] == "OUTPUT0" and output["shape"] == [1, 3]
            await placer.retire(DEMO_MODEL, result.worker.id, reason="test")
            ready = await client.get(f"{result.placement.url}/v2/models/{DEMO_MODEL}/ready")
            assert ready.status_code != 200
        assert await store.list_placements(DEMO_MODEL) == []
    finally:
        await placer.close()
        await workers.close()
        await store.close()
