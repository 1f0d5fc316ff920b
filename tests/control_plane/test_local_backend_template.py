"""The local backend's worker template: forked workers serve and stop like spawned ones, a
template that died gives way to spawning, and the template forks only with one thread.

Real processes on loopback (the template, its forked workers, a spawned worker) except for
the two in-process tests at the end (the wire format, and the template's loop refusing to
fork while a second thread runs, which it checks before forking at all)."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import re
import signal
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from prometheus_client import CollectorRegistry

from control_plane.activation import Orchestrator
from control_plane.backends.base import PoolSpec
from control_plane.backends.local import FORKED, SPAWNED, LocalBackend
from control_plane.metrics import ControlPlaneMetrics
from control_plane.placement import Placer
from control_plane.store.memory import MemoryStateStore
from control_plane.worker_client import WorkerClient
from data_plane.demo import DEMO_MODEL, write_demo_repository
from data_plane.template.child import Inherited
from data_plane.template.server import ForkServer
from foundation.proto import model_config_pb2 as mc
from foundation.records import ModelRecord
from foundation.worker_template import ForkRequest, Ready, Refused, decode, encode
from runtimes.nvml import count_gpus
from tests.control_plane.fakes import Acting, make_settings
from tests.control_plane.test_local_backend import Lost, is_alive, wait_gone
from tests.models import (
    load_mlp_weights,
    mlp_reference,
    read_config,
    write_config,
    write_torchscript_mlp,
)

pytestmark = pytest.mark.anyio

LOST_TIMEOUT_S = 30.0


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[tuple[LocalBackend, Lost]]:
    settings = make_settings(
        tmp_path / "cache",
        worker_log_dir=tmp_path / "logs",
        worker_health_interval_s=0.5,
        worker_stop_timeout_s=10.0,
        allowed_storage=(str(tmp_path),),
    )
    lost = Lost()
    local = LocalBackend(
        settings,
        on_worker_lost=lost,
        repository=tmp_path / "repository",
        extra_env={"ZEROSERVE_ALLOWED_STORAGE": str(tmp_path)},
    )
    await local.ensure_pool(PoolSpec(name=settings.pool, max_workers=2))
    try:
        yield local, lost
    finally:
        await local.close()


@pytest.mark.integration
async def test_a_forked_worker_serves_and_stops_cleanly(
    backend: tuple[LocalBackend, Lost], tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """An activation with no worker forks one: it loads and answers the demo model, the
    timeline shows its process and boot, and SIGTERM ends it with status 0."""
    local, lost = backend
    model_dir = write_demo_repository(tmp_path / "models")
    settings = make_settings(tmp_path / "cache", allowed_storage=(str(tmp_path),))
    store = MemoryStateStore()
    workers = WorkerClient(load_timeout_s=60.0, unload_timeout_s=10.0)
    pool = PoolSpec(name=settings.pool, max_workers=2)
    placer = Placer(store, local, pool, workers, settings)
    orchestrator = Orchestrator(
        store, placer, settings, ControlPlaneMetrics(CollectorRegistry()), Acting()
    )
    try:
        await store.create_model(ModelRecord(name=DEMO_MODEL, storage_uri=str(model_dir)))
        placement = await orchestrator.activate(DEMO_MODEL)
        (timeline,) = await store.list_activations(DEMO_MODEL)
        row = np.arange(4, dtype=np.float32).reshape(1, 4)
        async with httpx.AsyncClient(timeout=30.0) as http:
            response = await http.post(
                f"{placement.url}/v2/models/{DEMO_MODEL}/infer",
                json={
                    "inputs": [
                        {
                            "name": "INPUT0",
                            "datatype": "FP32",
                            "shape": [1, 4],
                            "data": row.ravel().tolist(),
                        }
                    ]
                },
            )
    finally:
        await orchestrator.close()
        await placer.close()
        await workers.close()
        await store.close()
    assert response.status_code == 200, response.text
    session = ort.InferenceSession(str(model_dir / "1" / "model.onnx"))
    (expected,) = session.run(None, {"INPUT0": row})
    assert np.allclose(response.json()["outputs"][0]["data"], expected.ravel(), atol=1e-5)

    assert timeline["worker"]["start_method"] == FORKED
    phases = [p["phase"] for p in timeline["phases"]]
    assert phases[:3] == ["queued", "worker_process", "worker_ready"]
    assert 0 < timeline["durations_s"]["worker_boot"] <= timeline["durations_s"]["worker"]

    # The template checked threading.active_count() before it forked, and said it at start.
    assert local.template is not None
    ready = await local.template.start(timeout_s=1.0)
    assert ready.threads == 1
    worker_id = placement.worker_id
    pid = local.details(worker_id)["pid"]
    assert isinstance(pid, int)
    assert parent_of(pid) == ready.pid == local.template.pid
    assert os.getpgid(pid) == pid  # its own session and process group
    with caplog.at_level(logging.INFO, logger="control_plane.backends.local"):
        await local.stop_worker(worker_id)
    assert f"worker {worker_id} stopped (exit status 0)" in caplog.messages
    assert not is_alive(pid)
    assert lost.ids == []


@pytest.mark.integration
async def test_a_dead_template_gives_way_to_spawning(backend: tuple[LocalBackend, Lost]):
    """Killing the template kills its workers (reported lost); the next worker is spawned
    while a new template starts, and the one after is forked from that."""
    local, lost = backend
    forked = await local.start_worker("default")
    assert local.details(forked.id)["start"] == FORKED
    forked_pid = local.details(forked.id)["pid"]
    assert local.template is not None
    template_pid = local.template.pid
    assert isinstance(template_pid, int) and isinstance(forked_pid, int)

    os.kill(template_pid, signal.SIGKILL)
    await asyncio.wait_for(lost.event.wait(), LOST_TIMEOUT_S)
    assert lost.ids == [forked.id]
    assert await wait_gone(forked_pid)

    spawned = await local.start_worker("default")
    assert local.details(spawned.id)["start"] == SPAWNED
    assert spawned.start_method == SPAWNED
    assert await local.health(spawned.id)

    # That start also began a new template, which the next worker is forked from.
    await local.stop_worker(spawned.id)
    assert local.template is not None and local.template.pid != template_pid
    again = await local.start_worker("default")
    assert again.start_method == FORKED
    again_pid = local.details(again.id)["pid"]
    assert isinstance(again_pid, int) and parent_of(again_pid) == local.template.pid


async def test_turned_off_no_template_starts(tmp_path: Path):
    settings = make_settings(tmp_path / "cache", worker_template=False)
    local = LocalBackend(settings, on_worker_lost=Lost(), repository=tmp_path / "repository")
    try:
        await local.ensure_pool(PoolSpec(name="default"))
        assert local.template is None
    finally:
        await local.close()


def test_the_template_refuses_to_fork_beside_a_thread():
    """The loop runs on a thread of this process, so two threads exist: it must refuse."""
    ours, theirs = socket.socketpair()
    inherited = Inherited(template_pid=os.getpid(), libc=None, gpu_count=0)
    server = ForkServer(theirs, inherited)
    ready = Ready(pid=os.getpid(), threads=1, imports_s=0.0)
    loop = threading.Thread(target=server.serve, args=(ready,), daemon=True)
    loop.start()
    try:
        ours.settimeout(10.0)
        with ours.makefile("rb") as reader:
            assert isinstance(decode(reader.readline()), Ready)
            ours.sendall(encode(ForkRequest(id=7, worker_id="w", settings={})))
            answer = decode(reader.readline())
    finally:
        ours.close()
        loop.join(10.0)
        theirs.close()
    assert isinstance(answer, Refused)
    # This process's threads: the main one, the loop's, and any its test runner adds.
    threads = re.fullmatch(r"the template runs (\d+) threads; it forks with 1", answer.reason)
    assert answer.id == 7 and threads is not None and int(threads.group(1)) >= 2, answer
    assert not loop.is_alive()  # the hang-up ended the loop


@pytest.mark.parametrize(
    "line", [b"", b"{}", b'{"type":"nope"}', b'{"type":"forked","id":1}', b"[1]"]
)
def test_garbage_is_no_message(line: bytes):
    with pytest.raises(ValueError, match="not a worker-template message"):
        decode(line)


def _cuda_available() -> bool:
    """torch installed and a GPU visible, found without importing torch (seconds) or
    touching CUDA in the test process."""
    return importlib.util.find_spec("torch") is not None and count_gpus().count > 0


@pytest.mark.gpu
@pytest.mark.integration
@pytest.mark.skipif(not _cuda_available(), reason="needs torch with a CUDA device")
async def test_a_cuda_pool_worker_forked_from_a_torch_template_runs_on_the_gpu(tmp_path: Path):
    """A cuda pool's template imports torch without initialising CUDA (CUDA does not
    survive a fork), so the forked worker initialises its own and serves on the GPU."""
    models = tmp_path / "models"
    model_dir = write_torchscript_mlp(models, "mlp")
    config = read_config(model_dir)
    config.instance_group[0].kind = mc.ModelInstanceGroup.KIND_GPU
    write_config(model_dir, config)
    settings = make_settings(
        tmp_path / "cache",
        worker_device="cuda",
        worker_log_dir=tmp_path / "logs",
        allowed_storage=(str(tmp_path),),
    )
    local = LocalBackend(
        settings,
        on_worker_lost=Lost(),
        repository=tmp_path / "repository",
        extra_env={"ZEROSERVE_ALLOWED_STORAGE": str(tmp_path)},
    )
    try:
        await local.ensure_pool(PoolSpec(name="default", device="cuda"))
        worker = await local.start_worker("default")
        assert worker.start_method == FORKED
        assert local.template is not None
        assert (await local.template.start(timeout_s=1.0)).threads == 1
        row = np.ones((1, 16), np.float32)
        async with httpx.AsyncClient(timeout=120.0) as http:
            loaded = await http.post(
                f"{worker.url}/v2/repository/models/mlp/load",
                json={"parameters": {"storage_uri": str(model_dir)}},
            )
            assert loaded.status_code == 200, loaded.text
            response = await http.post(
                f"{worker.url}/v2/models/mlp/infer",
                json={
                    "inputs": [
                        {
                            "name": "INPUT0",
                            "datatype": "FP32",
                            "shape": [1, 16],
                            "data": row.ravel().tolist(),
                        }
                    ]
                },
            )
        assert response.status_code == 200, response.text
        assert np.allclose(
            response.json()["outputs"][0]["data"],
            mlp_reference(load_mlp_weights(model_dir), row).ravel(),
            atol=1e-4,
        )
    finally:
        await local.close()
