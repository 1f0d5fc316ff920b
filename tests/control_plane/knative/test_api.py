"""The applier (``KubeApi``): the real ``kubernetes`` client against a fake API server.

No Kubernetes API server can run here (no cluster, no container runtime), so these tests
point the official client at ``fake_kube.FakeKube``, a small HTTP server implementing only
the calls the backend makes. They check what goes over the wire (methods, paths, content
types: server-side apply for Services, merge patches with a ``resourceVersion``
precondition for Revisions) and how answers and failures come back. Behaviour of a real API
server beyond those calls, and of Knative's controllers, is not verified here.
"""

from __future__ import annotations

import tomllib
from collections.abc import AsyncIterator, Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from packaging.requirements import Requirement

from control_plane.backends.base import PoolSpec
from control_plane.backends.knative.api import KubeApi
from control_plane.backends.knative.errors import KubeApiError, KubeConflictError
from control_plane.backends.knative.manifests import (
    deletion_cost_patch,
    make_service,
    min_scale_patch,
    revision_name,
)
from control_plane.backends.knative.settings import KnativeSettings, PoolTemplate
from tests.control_plane.knative.fake_kube import FakeKube

pytestmark = pytest.mark.anyio


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube(config_maps={("knative-serving", "config-features"): {"a": "b"}}) as fake:
        yield fake


@pytest.fixture
async def api(kube: FakeKube) -> AsyncIterator[KubeApi]:
    client = KubeApi(kube.api_client(), namespace="zeroserve", request_timeout_s=5)
    try:
        yield client
    finally:
        await client.close()


def manifest(**template: Any) -> dict[str, Any]:
    return make_service(
        PoolSpec(name="default", max_workers=3),
        PoolTemplate(**template),
        KnativeSettings(),
        allowed_storage=(),
    )


async def test_apply_is_server_side_and_idempotent(api: KubeApi, kube: FakeKube):
    service = manifest()
    applied = await api.apply_service(service)
    assert applied["status"]["latestCreatedRevisionName"] == revision_name(service)
    await api.apply_service(service)
    (first, second) = kube.calls("PATCH", "/services/zeroserve-default")
    assert first.content_type == "application/apply-patch+yaml"
    assert first.query["fieldManager"] == ["zeroserve-control-plane"]
    assert first.query["force"][0].lower() == "true"  # Go's ParseBool takes "True"
    assert len(kube.revisions) == 1
    got = await api.get_service("zeroserve-default")
    assert got is not None and got["spec"] == service["spec"]
    assert await api.get_service("absent") is None


async def test_an_invalid_manifest_is_refused_with_the_servers_message(api: KubeApi):
    service = manifest()
    service["spec"]["template"]["spec"]["containerConcurrency"] = "lots"
    with pytest.raises(KubeApiError) as caught:
        await api.apply_service(service)
    assert caught.value.status == 422
    assert "containerConcurrency" in caught.value.reason


async def test_revision_patch_with_a_stale_version_conflicts(api: KubeApi, kube: FakeKube):
    service = manifest()
    await api.apply_service(service)
    name = revision_name(service)
    revision = await api.get_revision(name)
    assert revision is not None
    version = revision["metadata"]["resourceVersion"]
    patched = await api.patch_revision(name, min_scale_patch(2, resource_version=version))
    assert patched["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] == "2"
    (call,) = kube.calls("PATCH", f"/revisions/{name}")
    assert call.content_type == "application/merge-patch+json"
    with pytest.raises(KubeConflictError):
        await api.patch_revision(name, min_scale_patch(3, resource_version=version))
    assert len(kube.live_pods()) == 2


async def test_pods_list_patch_and_delete(api: KubeApi, kube: FakeKube):
    service = manifest()
    await api.apply_service(service)
    await api.patch_revision(revision_name(service), min_scale_patch(1, resource_version=None))
    pods = await api.list_pods("zeroserve.io/pool=default")
    (pod,) = pods["items"]
    assert (await api.list_pods("zeroserve.io/pool=other"))["items"] == []
    name = pod["metadata"]["name"]
    await api.patch_pod(name, deletion_cost_patch(-5))
    (listed,) = (await api.list_pods("zeroserve.io/pool"))["items"]
    assert listed["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"] == "-5"
    assert await api.delete_pod(name, grace_period_s=3)
    (call,) = kube.calls("DELETE", f"/pods/{name}")
    assert call.query["gracePeriodSeconds"] == ["3"]
    assert not await api.delete_pod("absent")


async def test_delete_service(api: KubeApi, kube: FakeKube):
    await api.apply_service(manifest())
    assert await api.delete_service("zeroserve-default")
    assert not await api.delete_service("zeroserve-default")
    assert kube.services == {} and kube.revisions == {}


async def test_config_maps(api: KubeApi, kube: FakeKube):
    assert await api.read_config_map("knative-serving", "config-features") == {"a": "b"}
    assert await api.read_config_map("knative-serving", "config-defaults") is None
    kube.forbidden_config_maps.add(("knative-serving", "config-features"))
    with pytest.raises(KubeApiError) as caught:
        await api.read_config_map("knative-serving", "config-features")
    assert caught.value.status == 403


async def test_no_answer_is_an_error_not_a_hang():
    """A closed port: the client's connection error becomes ``KubeApiError`` (status 0)."""
    with FakeKube() as kube:
        client = kube.api_client()
    client.configuration.retries = 0
    api = KubeApi(client, namespace="zeroserve", request_timeout_s=2)
    try:
        with pytest.raises(KubeApiError) as caught:
            await api.list_pods("zeroserve.io/pool")
        assert caught.value.status == 0
    finally:
        await api.close()


async def test_patch_calls_are_what_the_installed_client_takes(
    api: KubeApi, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
):
    """The backend passes ``_content_type`` (and ``field_manager``, ``force``) to the real
    client's patch methods. The client checks keyword arguments itself: one it does not
    know raises ``ApiTypeError`` (as ``_content_type`` does before kubernetes 36), and one
    it takes but ignores would send its default patch type, which the fake server answers
    with 415. So each call goes through the installed client's own method, unchanged, and
    the content type asked for must be the one that reached the server."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def spy(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append((name, kwargs))
            return original(self, *args, **kwargs)

        return recorded

    for cls, name in [
        (k8s.CustomObjectsApi, "patch_namespaced_custom_object"),
        (k8s.CoreV1Api, "patch_namespaced_pod"),
    ]:
        monkeypatch.setattr(cls, name, spy(name, getattr(cls, name)))
    service = manifest()
    await api.apply_service(service)
    await api.patch_revision(revision_name(service), min_scale_patch(1, resource_version=None))
    (pod,) = (await api.list_pods("zeroserve.io/pool"))["items"]
    await api.patch_pod(pod["metadata"]["name"], deletion_cost_patch(-1))
    apply, merge = "application/apply-patch+yaml", "application/merge-patch+json"
    assert [(name, kwargs["_content_type"]) for name, kwargs in seen] == [
        ("patch_namespaced_custom_object", apply),
        ("patch_namespaced_custom_object", merge),
        ("patch_namespaced_pod", merge),
    ]
    assert [r.content_type for r in kube.requests if r.method == "PATCH"] == [apply, merge, merge]


def test_the_kubernetes_pin_is_where_content_type_works():
    """pyproject's range for the client starts at 36, the first release whose patch methods
    take ``_content_type``, in the k8s extra and the dev extra alike, and holds the client
    the tests above ran."""
    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    pins = {
        str(Requirement(line).specifier)
        for extra in ("k8s", "dev")
        for line in extras[extra]
        if Requirement(line).name == "kubernetes"
    }
    (pin,) = pins
    specifier = Requirement(f"kubernetes{pin}").specifier
    assert not specifier.contains("35.0.0") and specifier.contains("36.0.0")
    assert specifier.contains(version("kubernetes"))
