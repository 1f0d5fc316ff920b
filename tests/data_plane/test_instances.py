"""Several instance groups: a runtime per device, each with its share of the instances, and
as many executions at once as Triton's sum of instances. GPUs are counted, not used: the
runtimes here record what they were asked to load and run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from data_plane.errors import ModelLoadError
from data_plane.instances import Instances, config_for, device_shares
from data_plane.repository import ModelRepository, RepositorySettings
from data_plane.storage import CacheSettings, NodeCache, parse_storage_uri
from foundation import model_config
from foundation.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup
from runtimes.base import ModelRuntime, RuntimeOptions, RuntimeState, instance_count
from runtimes.capabilities import Capabilities
from runtimes.registry import RuntimeFactory
from tests.models import read_config, write_config, write_onnx_identity

pytestmark = pytest.mark.anyio


def _config(groups: str, gpu_count: int) -> ModelConfig:
    config = model_config.parse_pbtxt(f"instance_group [{groups}]")
    model_config.normalize(config, name="m", gpu_count=gpu_count)
    return config


@pytest.mark.parametrize(
    ("groups", "gpu_count", "expected"),
    [
        pytest.param("{ count: 3 kind: KIND_CPU }", 0, [("cpu", 3)], id="one-cpu-group"),
        pytest.param(
            "{ count: 2 kind: KIND_CPU }, { count: 3 kind: KIND_CPU }",
            0,
            [("cpu", 5)],
            id="cpu-groups-add-up",
        ),
        pytest.param(
            "{ count: 2 kind: KIND_GPU }", 2, [("cuda:0", 2), ("cuda:1", 2)], id="each-gpu"
        ),
        pytest.param(
            "{ count: 1 kind: KIND_GPU gpus: [1] }, { count: 2 kind: KIND_CPU },"
            " { count: 1 kind: KIND_GPU gpus: [1] }",
            2,
            [("cuda:1", 2), ("cpu", 2)],
            id="mixed",
        ),
    ],
)
def test_device_shares_count_triton_instances(groups, gpu_count, expected):
    config = _config(groups, gpu_count)
    shares = device_shares(config)
    assert [(s.device, s.count) for s in shares] == expected
    assert sum(s.count for s in shares) == model_config.instance_total(config)
    for share in shares:
        # A runtime on one device of several loads with that device's groups only, so its
        # own instance count is its share.
        narrowed = config_for(config, share, is_only=len(shares) == 1)
        assert instance_count(narrowed) == share.count


class RecordingRuntime(ModelRuntime):
    """Loads nothing; records its device and instance count, and how many executions it
    runs at once, each held until the test releases it."""

    kind = "onnxruntime"
    model_filename = "model.onnx"
    created: list[RecordingRuntime]

    def __init__(
        self,
        *,
        name: str,
        version: int,
        options: RuntimeOptions,
        changed: asyncio.Condition | None = None,
    ) -> None:
        super().__init__(name=name, version=version, options=options)
        self.changed = changed or asyncio.Condition()
        """Notified whenever an execution starts."""
        self.device = ""
        self.instances = 0
        self.running = 0
        self.peak = 0
        self.release = asyncio.Event()
        self.executions = 0

    async def load(self, model_dir: Path, config: ModelConfig, device: str) -> None:
        self.device, self.instances = device, instance_count(config)
        self.state = RuntimeState.READY

    async def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.running += 1
        self.executions += 1
        self.peak = max(self.peak, self.running)
        async with self.changed:
            self.changed.notify_all()
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        return {"OUTPUT0": batch["INPUT0"]}

    async def unload(self) -> None:
        self.state = RuntimeState.UNLOADED


class RecordingFactory(RuntimeFactory):
    def __init__(self) -> None:
        super().__init__(RuntimeOptions())
        self.created: list[RecordingRuntime] = []
        self.changed = asyncio.Condition()
        self.runtime_class: type[RecordingRuntime] = RecordingRuntime

    def create(self, kind: str, *, name: str, version: int) -> ModelRuntime:
        runtime = self.runtime_class(
            name=name, version=version, options=self.options, changed=self.changed
        )
        self.created.append(runtime)
        return runtime

    async def wait_running(self, count: int) -> None:
        async with asyncio.timeout(10), self.changed:
            await self.changed.wait_for(lambda: sum(r.running for r in self.created) >= count)


@pytest.fixture
async def repository(tmp_path: Path) -> AsyncIterator[tuple[ModelRepository, RecordingFactory]]:
    repo = tmp_path / "repo"
    model_dir = write_onnx_identity(repo, "m", datatype="FP32", dims=(4,), max_batch_size=8)
    config = read_config(model_dir)
    config.ClearField("dynamic_batching")  # one request per execution
    del config.instance_group[:]
    config.instance_group.add(count=2, kind=ModelInstanceGroup.KIND_GPU, gpus=[0, 1])
    config.instance_group.add(count=1, kind=ModelInstanceGroup.KIND_CPU)
    write_config(model_dir, config)
    cache = NodeCache(
        CacheSettings(root=tmp_path / "cache", max_bytes=2**30), registry=CollectorRegistry()
    )
    factory = RecordingFactory()
    root = str(repo)
    repository = ModelRepository(
        RepositorySettings(
            root=parse_storage_uri(root, allowed=(root,)),
            allowed_storage=(root,),
            gpu_count=2,
            batcher_queue_bound=64,
            drain_timeout_s=5.0,
        ),
        cache,
        factory,
    )
    try:
        yield repository, factory
    finally:
        for runtime in factory.created:
            runtime.release.set()
        await repository.close()
        await cache.close()


async def test_several_groups_run_the_sum_of_their_instances_at_once(repository):
    repo, factory = repository
    await repo.load("m")
    assert sorted((r.device, r.instances) for r in factory.created) == [
        ("cpu", 1),
        ("cuda:0", 2),
        ("cuda:1", 2),
    ]
    model = repo.get("m")
    assert model.instances.count == 5
    # The config /config shows is the whole one, not a device's share.
    assert [g.count for g in model.config.instance_group] == [2, 1]
    row = {"INPUT0": np.ones((1, 4), dtype=np.float32)}
    calls = [asyncio.create_task(model.batcher.submit(row)) for _ in range(6)]
    await factory.wait_running(5)
    # Five instances, five executions at once, each device at its share; the sixth waits.
    await asyncio.sleep(0.05)
    assert sum(r.running for r in factory.created) == 5
    assert {r.device: r.running for r in factory.created} == {"cuda:0": 2, "cuda:1": 2, "cpu": 1}
    for runtime in factory.created:
        runtime.release.set()
    async with asyncio.timeout(10):
        results = await asyncio.gather(*calls)
    assert all(np.array_equal(r.outputs["OUTPUT0"], row["INPUT0"]) for r in results)
    assert sum(r.executions for r in factory.created) == 6


async def test_unload_frees_every_devices_runtime(repository):
    repo, factory = repository
    await repo.load("m")
    await repo.unload("m")
    assert [r.state for r in factory.created] == [RuntimeState.UNLOADED] * 3


class EngineRuntime(RecordingRuntime):
    """A runtime with an engine feature (here, sleep), like the LLM runtimes."""

    def resolve_capabilities(self) -> Capabilities:
        return Capabilities(sleep=self)


async def test_runtimes_with_engine_features_stay_on_one_device(repository):
    repo, factory = repository
    factory.runtime_class = EngineRuntime
    with pytest.raises(ModelLoadError, match=r"instance groups on several devices \(cuda:0"):
        await repo.load("m")
    # The runtime it had loaded to find out was unloaded again.
    assert [r.state for r in factory.created] == [RuntimeState.UNLOADED]


async def test_executions_go_to_the_runtime_with_instances_free():
    options, changed = RuntimeOptions(), asyncio.Condition()
    small = RecordingRuntime(name="m", version=1, options=options, changed=changed)
    large = RecordingRuntime(name="m", version=1, options=options, changed=changed)
    instances = Instances([(small, Capabilities(), 1), (large, Capabilities(), 3)])
    batch = {"INPUT0": np.zeros(1, dtype=np.float32)}
    calls = [asyncio.create_task(instances.infer(batch)) for _ in range(4)]
    async with asyncio.timeout(10), changed:
        await changed.wait_for(lambda: small.running + large.running >= 4)
    assert (small.running, large.running) == (1, 3)
    small.release.set()
    large.release.set()
    async with asyncio.timeout(10):
        await asyncio.gather(*calls)
