"""``KnativeBackend`` against a fake Kubernetes API server, over HTTP, with the real client.

No Kubernetes API server can run here (no cluster, no container runtime), so the backend
talks to ``fake_kube.FakeKube``: the calls it makes, plus a few-line stand-in for Knative's
revision controller, the ReplicaSet controller and a kubelet that makes pods ready at once
(``InstantKubelet``; their addresses are loopback ones nothing listens on). What these tests
show is the backend's side of the contract: which objects it changes and how (the Revision's
``min-scale``, never the Service after the first apply), how it finds, adopts and loses
workers, and what it says when Knative is not configured. How a real Knative reacts in time
is not verified here. ``tests/control_plane/test_backend_contract.py`` runs the behaviour the
local and knative backends share with real worker processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from control_plane.backends.base import PoolSpec
from control_plane.backends.knative.api import KubeApi
from control_plane.backends.knative.backend import KnativeBackend
from control_plane.backends.knative.errors import KnativeConfigError
from control_plane.backends.knative.settings import KnativeSettings, PoolTemplate
from control_plane.errors import NoCapacityError, WorkerStartError
from tests.control_plane.fakes import make_settings
from tests.control_plane.knative.fake_kube import FakeKube, InstantKubelet

pytestmark = pytest.mark.anyio

NS = "knative-serving"
GOOD_CONFIG = {
    (NS, "config-features"): {"kubernetes.podspec-volumes-hostpath": "enabled"},
    (NS, "config-autoscaler"): {"allow-zero-initial-scale": "true"},
    (NS, "config-defaults"): {"max-revision-timeout-seconds": "900"},
}
KNATIVE = KnativeSettings(pod_poll_interval_s=0.05, request_timeout_s=5)
MIN_SCALE = "autoscaling.knative.dev/min-scale"
WAIT_S = 10.0


class Lost:
    def __init__(self) -> None:
        self.ids: list[str] = []

    async def __call__(self, worker_id: str) -> None:
        self.ids.append(worker_id)


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube(config_maps=dict(GOOD_CONFIG)) as fake:
        yield fake


@contextlib.asynccontextmanager
async def running(
    kube: FakeKube,
    *,
    pool: PoolSpec | None = None,
    knative: KnativeSettings = KNATIVE,
    **overrides: Any,
) -> AsyncIterator[tuple[KnativeBackend, Lost]]:
    values: dict[str, Any] = {
        "worker_health_interval_s": 60.0,  # nothing listens on the fake pods' addresses
        "worker_start_timeout_s": 5.0,
        "worker_stop_timeout_s": 5.0,
    }
    values.update(overrides)
    lost = Lost()
    api = KubeApi(kube.api_client(), namespace=knative.namespace, request_timeout_s=5)
    backend = KnativeBackend(make_settings(None, **values), knative, api, on_worker_lost=lost)
    try:
        await backend.ensure_pool(pool or PoolSpec(name="default", max_workers=2))
        yield backend, lost
    finally:
        await backend.close()


def revision(kube: FakeKube) -> dict[str, Any]:
    (only,) = kube.revisions.values()
    return only


async def eventually(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - the conditions are plain state
            await asyncio.sleep(0.02)


async def test_start_scales_the_revision_and_returns_a_ready_pod(kube: FakeKube):
    async with running(kube) as (backend, lost):
        worker = await backend.start_worker("default")
        (pod,) = kube.live_pods()
        assert worker.id == pod["metadata"]["name"]
        assert worker.url == f"http://{pod['status']['podIP']}:8080"
        assert worker.grpc_address == f"{pod['status']['podIP']}:8001"
        assert worker.pool == "default"
        assert [w.id for w in backend.list_workers("default")] == [worker.id]
        assert revision(kube)["metadata"]["annotations"][MIN_SCALE] == "1"
        details = backend.details(worker.id)
        assert details["pod"] == worker.id and details["ready"] is True
        # Scaling touched the Revision only: one apply of the Service, one Revision.
        assert len(kube.calls("PATCH", "/services/")) == 1
        assert len(kube.revisions) == 1
        await backend.stop_worker(worker.id)
        assert kube.live_pods() == []
        assert backend.list_workers() == []
        assert revision(kube)["metadata"]["annotations"][MIN_SCALE] == "0"
        (cost,) = kube.calls("PATCH", f"/pods/{worker.id}")
        assert cost.content_type == "application/merge-patch+json"
        assert lost.ids == []
        assert not await backend.health(worker.id)


async def test_the_pod_stopped_is_the_one_asked_for(kube: FakeKube):
    """With two ready pods the ReplicaSet would remove the newer; the deletion cost makes
    it remove the one the control plane chose."""
    async with running(kube) as (backend, _):
        first = await backend.start_worker("default")
        second = await backend.start_worker("default")
        await backend.stop_worker(first.id)
        assert [p["metadata"]["name"] for p in kube.live_pods()] == [second.id]
        assert [w.id for w in backend.list_workers()] == [second.id]


async def test_pool_bound(kube: FakeKube):
    async with running(kube) as (backend, _):
        await asyncio.gather(backend.start_worker("default"), backend.start_worker("default"))
        with pytest.raises(NoCapacityError):
            await backend.start_worker("default")
        assert revision(kube)["metadata"]["annotations"][MIN_SCALE] == "2"


async def test_scaling_survives_conflicting_writes(kube: FakeKube):
    async with running(kube) as (backend, _):
        kube.conflicts_to_inject = 2
        await backend.start_worker("default")
        assert revision(kube)["metadata"]["annotations"][MIN_SCALE] == "1"
        assert len(kube.calls("PATCH", "/revisions/")) == 3


async def test_a_pod_deleted_by_someone_else_is_lost_and_replaced(kube: FakeKube):
    async with running(kube) as (backend, lost):
        worker = await backend.start_worker("default")
        kube.handle("DELETE", f"/api/v1/namespaces/zeroserve/pods/{worker.id}", {}, None)
        await eventually(lambda: lost.ids == [worker.id])
        # min-scale is still 1: the ReplicaSet's replacement becomes a new, empty worker.
        await eventually(lambda: len(backend.list_workers()) == 1)
        assert backend.list_workers()[0].id != worker.id


async def test_a_restarted_container_is_a_new_worker(kube: FakeKube):
    async with running(kube) as (backend, lost):
        worker = await backend.start_worker("default")
        kube.restarted(worker.id)
        await eventually(lambda: lost.ids == [worker.id])
        assert backend.list_workers() == []  # not ready: not a worker yet
        kube.set_ready(worker.id, True)
        await eventually(lambda: [w.id for w in backend.list_workers()] == [f"{worker.id}-r1"])


async def test_readiness_lost_while_running_keeps_the_worker(kube: FakeKube):
    """``/v2/health/ready`` can fail while the pod runs (a shutdown begins)."""
    async with running(kube) as (backend, lost):
        worker = await backend.start_worker("default")
        kube.set_ready(worker.id, False)
        await asyncio.sleep(0.3)
        assert [w.id for w in backend.list_workers()] == [worker.id]
        assert lost.ids == []


async def test_a_worker_failing_its_probes_is_lost_and_its_pod_deleted(kube: FakeKube):
    async with running(kube, worker_health_interval_s=0.05, worker_health_failures=2) as (
        backend,
        lost,
    ):
        worker = await backend.start_worker("default")
        await eventually(lambda: worker.id in lost.ids)
        await eventually(lambda: len(kube.calls("DELETE", f"/pods/{worker.id}")) == 1)
        # Its replacement fails too (nothing listens here), but the deleted pod is never
        # taken back and reported a second time.
        await eventually(lambda: len(lost.ids) >= 2)
        assert lost.ids.count(worker.id) == 1


async def test_a_new_control_plane_adopts_the_pods(kube: FakeKube):
    """Pods outlive a control-plane replica; the next one finds the same workers."""
    async with running(kube) as (backend, _):
        started = {
            w.id for w in await asyncio.gather(*(backend.start_worker("default") for _ in "ab"))
        }
    assert len(kube.live_pods()) == 2  # close() left them running
    async with running(kube) as (successor, _):
        assert {w.id for w in successor.list_workers()} == started
        assert revision(kube)["metadata"]["annotations"][MIN_SCALE] == "2"
        assert len(kube.revisions) == 1


def min_scales(kube: FakeKube) -> dict[str, str]:
    return {
        r["metadata"]["name"]: r["metadata"]["annotations"][MIN_SCALE]
        for r in kube.revisions.values()
    }


async def test_a_changed_template_keeps_the_old_revisions_pods_until_they_are_stopped(
    kube: FakeKube,
):
    """A changed template stamps a Revision that starts empty. The old Revision's pod, and
    the models loaded there, stay a worker (the Service keeps routing the old Revision at 0 %,
    so Knative keeps its pods); a new worker comes from the new Revision; stopping the old
    pod lowers its own Revision's min-scale, not the new one's, and then the old Revision is
    no longer routed."""
    async with running(kube) as (backend, _):
        old = await backend.start_worker("default")
    (old_revision,) = min_scales(kube)
    changed = KNATIVE.model_copy(update={"pools": {"default": PoolTemplate(memory="9Gi")}})
    async with running(kube, knative=changed) as (backend, lost):
        (new_revision,) = set(min_scales(kube)) - {old_revision}
        traffic = kube.services[("zeroserve", "zeroserve-default")]["spec"]["traffic"]
        assert {"revisionName": old_revision, "percent": 0} in traffic
        assert [w.id for w in backend.list_workers()] == [old.id]
        new = await backend.start_worker("default")
        assert new.id.startswith(new_revision)
        assert min_scales(kube) == {old_revision: "1", new_revision: "1"}
        await backend.stop_worker(old.id)
        assert min_scales(kube) == {old_revision: "0", new_revision: "1"}
        assert [w.id for w in backend.list_workers()] == [new.id]
        assert [p["metadata"]["name"] for p in kube.live_pods()] == [new.id]
        traffic = kube.services[("zeroserve", "zeroserve-default")]["spec"]["traffic"]
        assert traffic == [{"latestRevision": True, "percent": 100}]
        assert lost.ids == []


async def test_an_unschedulable_start_fails_with_the_reason_and_is_taken_back(kube: FakeKube):
    kubelet = kube.kubelet
    assert isinstance(kubelet, InstantKubelet)
    kubelet.is_schedulable = False
    async with running(kube, worker_start_timeout_s=0.5) as (backend, _):
        with pytest.raises(WorkerStartError, match="Insufficient nvidia.com/gpu"):
            await backend.start_worker("default")
        await eventually(lambda: revision(kube)["metadata"]["annotations"][MIN_SCALE] == "0")
        await eventually(lambda: kube.live_pods() == [])


async def test_delete_pool_deletes_the_service(kube: FakeKube):
    async with running(kube) as (backend, lost):
        await backend.start_worker("default")
        await backend.delete_pool("default")
        assert kube.services == {} and kube.live_pods() == []
        assert backend.list_workers() == []
        assert lost.ids == []
        with pytest.raises(WorkerStartError, match="unknown pool"):
            await backend.start_worker("default")


async def test_a_default_knative_install_is_refused_with_what_to_fix():
    with FakeKube(config_maps={(NS, "config-features"): {}, (NS, "config-autoscaler"): {}}) as kube:
        with pytest.raises(KnativeConfigError) as caught:
            async with running(kube):
                pass
        message = caught.value.message
        assert "allow-zero-initial-scale" in message
        assert "kubernetes.podspec-volumes-hostpath" in message
        assert f"configmap {NS}/config-defaults does not exist" in message
        assert "kubectl -n knative-serving patch configmap" in message
        assert kube.calls("PATCH", "/services/") == []  # nothing applied


async def test_unreadable_config_is_reported_and_can_be_skipped(
    kube: FakeKube, caplog: pytest.LogCaptureFixture
):
    kube.forbidden_config_maps.add((NS, "config-features"))
    with pytest.raises(KnativeConfigError, match="cannot read configmap knative-serving/config"):
        async with running(kube):
            pass
    with caplog.at_level(logging.WARNING):
        async with running(kube, knative=KNATIVE.model_copy(update={"config_check": "warn"})):
            pass
    assert "ZEROSERVE_KNATIVE_CONFIG_CHECK=off" in caplog.text
    async with running(kube, knative=KNATIVE.model_copy(update={"config_check": "off"})):
        pass


async def test_a_pool_without_a_template_is_refused(kube: FakeKube):
    with pytest.raises(KnativeConfigError, match="no pod template"):
        async with running(kube, pool=PoolSpec(name="gpu-l4", device="cuda")):
            pass


async def test_created_from_a_kubeconfig(kube: FakeKube, tmp_path):
    """``create_knative_backend`` builds its client from a kubeconfig file when given one
    (in a pod it uses the service account instead)."""
    from control_plane.backends.knative.backend import create_knative_backend

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: '{kube.url}'}}}}]\n"
        "users: [{name: fake, user: {token: not-a-secret}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
    )
    knative = KNATIVE.model_copy(update={"kubeconfig": kubeconfig})
    backend = create_knative_backend(make_settings(None), knative, on_worker_lost=Lost())
    try:
        await backend.ensure_pool(PoolSpec(name="default"))
        assert len(kube.services) == 1
    finally:
        await backend.close()


def test_the_control_plane_command_says_what_knative_lacks(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """``zeroserve control-plane --backend knative`` wires the backend in, and exits with
    the list of what to fix when Knative is not configured (here: a default install)."""
    from zeroserve.cli import main

    default_install: dict[tuple[str, str], dict[str, str]] = {
        (NS, name): {} for name in ("config-features", "config-autoscaler", "config-defaults")
    }
    with FakeKube(config_maps=default_install) as kube:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters: [{{name: fake, cluster: {{server: '{kube.url}'}}}}]\n"
            "users: [{name: fake, user: {token: not-a-secret}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
        )
        monkeypatch.setenv("ZEROSERVE_ADMIN_TOKEN", "test-admin-token")
        monkeypatch.setenv("ZEROSERVE_KNATIVE_KUBECONFIG", str(kubeconfig))
        code = main(
            ["control-plane", "--backend", "knative", "--admin-port", "0"]
            + ["--cache-dir", str(tmp_path / "cache")]
        )
    assert code == 2
    err = capsys.readouterr().err
    assert "allow-zero-initial-scale" in err
    assert "kubectl -n knative-serving patch configmap" in err
