"""Two pools on the knative backend: a vLLM model gets a pod of the vllm pool's Knative
Service, an ONNX one a pod of the gpu pool's, and the reaper scales both back to zero.

The Kubernetes API is ``fake_kube.FakeKube`` (no API server can run here), driven by the
real client; its pods are records whose addresses nothing listens on, so the workers' HTTP
API is the recording ``FakeWorkers``.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from control_plane.backends.knative.api import KubeApi
from control_plane.backends.knative.backend import KnativeBackend
from control_plane.backends.knative.settings import KnativeSettings, PoolTemplate
from control_plane.metrics import ControlPlaneMetrics
from control_plane.placement import PoolPlacers
from control_plane.reaper import Reaper
from control_plane.settings import PoolSettings
from control_plane.store.memory import MemoryStateStore
from foundation.records import ModelRecord, ResourceSpec, ScalingSpec
from tests.control_plane.fakes import Acting, FakeWorkers, make_settings
from tests.control_plane.knative.fake_kube import SERVICE_LABEL, FakeKube
from tests.control_plane.knative.test_backend import GOOD_CONFIG
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio

MIN_SCALE = "autoscaling.knative.dev/min-scale"


class NoActivations:
    def is_activating(self, model: str) -> bool:
        return False

    def request(self, model: str, *, trigger: str = "request") -> None:
        raise AssertionError(f"no activation expected here ({model}, {trigger})")


class Liveness:
    async def is_live(self, url: str) -> bool:
        return True


async def no_loss(worker_id: str) -> None:
    raise AssertionError(f"worker {worker_id} lost")


def min_scales(kube: FakeKube) -> dict[str, str]:
    """Knative Service -> its Revision's min-scale."""
    return {
        r["metadata"]["labels"][SERVICE_LABEL]: r["metadata"]["annotations"][MIN_SCALE]
        for r in kube.revisions.values()
    }


async def test_models_get_pods_of_their_pools_service_and_both_scale_to_zero():
    wall, mono = FakeClock(1_000_000.0), FakeClock(500.0)
    settings = make_settings(
        pool="gpu",
        worker_device="cuda",
        extra_pools=(PoolSettings(name="vllm", backends=("vllm",), device="cuda"),),
        pool_grace_period_s=0.0,
        worker_health_interval_s=60.0,  # nothing listens on the fake pods' addresses
        worker_start_timeout_s=5.0,
        worker_stop_timeout_s=5.0,
    )
    template = PoolTemplate(gpus=1)
    knative = KnativeSettings(
        pod_poll_interval_s=0.05,
        request_timeout_s=5,
        pools={"gpu": template, "vllm": template.model_copy(update={"image": "runtime-vllm"})},
    )
    store = MemoryStateStore(clock=mono)
    workers = FakeWorkers()
    with FakeKube(config_maps=dict(GOOD_CONFIG)) as kube:
        api = KubeApi(kube.api_client(), namespace=knative.namespace, request_timeout_s=5)
        backend = KnativeBackend(settings, knative, api, on_worker_lost=no_loss)
        placer = PoolPlacers(store, backend, workers, settings, wall=wall)
        reaper = Reaper(
            store,
            placer,
            backend,
            NoActivations(),
            Liveness(),
            settings,
            ControlPlaneMetrics(CollectorRegistry()),
            Acting(),
            clock=mono,
            wall=wall,
        )
        try:
            await placer.ensure_pools()
            placed = {}
            for name, backend_name in (("llm", "vllm"), ("onnx", "onnxruntime")):
                record = ModelRecord(
                    name=name,
                    storage_uri=f"/models/{name}",
                    backend=backend_name,
                    scaling=ScalingSpec(idle_timeout_s=10.0),
                    resources=ResourceSpec("cuda"),
                )
                await store.create_model(record)
                placed[name] = (await placer.place(record)).worker
            pods = {p["metadata"]["name"]: p for p in kube.live_pods()}
            service = {
                name: pods[w.id]["metadata"]["labels"][SERVICE_LABEL] for name, w in placed.items()
            }
            assert service == {
                "llm": f"{knative.service_prefix}vllm",
                "onnx": f"{knative.service_prefix}gpu",
            }
            images = {
                name: pods[w.id]["spec"]["containers"][0]["image"] for name, w in placed.items()
            }
            assert images == {"llm": "runtime-vllm", "onnx": template.image}
            assert set(min_scales(kube).values()) == {"1"}
            wall.advance(11.0)
            for _ in range(2):  # the models go, then their empty workers
                await reaper.sweep()
                await reaper.settle()
            assert await store.list_placements() == []
            assert backend.list_workers() == []
            assert set(min_scales(kube).values()) == {"0"}
        finally:
            await reaper.close()
            await placer.close()
            await backend.close()
            await store.close()
