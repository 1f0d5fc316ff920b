"""The pure builders: every Knative Service they produce validates against Knative's Service
CRD (tests/control_plane/knative/data) and, as a Pod, against Kubernetes' own schemas; and
the choices that matter for GPUs are in it."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.backends.base import PoolSpec
from control_plane.backends.knative.manifests import (
    DELETION_COST_ANNOTATION,
    MIN_SCALE_ANNOTATION,
    SAFE_TO_EVICT_ANNOTATION,
    deletion_cost_patch,
    make_service,
    min_scale_of,
    min_scale_patch,
    pin_revisions,
    pool_selector,
    revision_name,
    service_name,
)
from control_plane.backends.knative.settings import KnativeSettings, PoolTemplate, Toleration
from tests.control_plane.knative.schemas import knative_service_errors, pod_template_errors

GPU_TEMPLATE = PoolTemplate(
    image="registry.example/zeroserve-runtime-cuda:0.1.0@sha256:" + "a" * 64,
    gpus=1,
    cpu="6",
    memory="24Gi",
    node_selector={
        "zeroserve.io/node-pool": "gpu",
        "node.kubernetes.io/instance-type": "g6.xlarge",
    },
    tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),),
    runtime_class_name="nvidia",
)


def build(
    pool: PoolSpec | None = None,
    template: PoolTemplate | None = None,
    **settings: Any,
) -> dict[str, Any]:
    return make_service(
        pool or PoolSpec(name="default"),
        template or PoolTemplate(),
        KnativeSettings(**settings),
        allowed_storage=("s3://models/prod", "/models"),
    )


CASES = [
    pytest.param(PoolSpec(name="default"), PoolTemplate(), {}, id="cpu-defaults"),
    pytest.param(
        PoolSpec(name="gpu-l4", device="cuda", memory_bytes=20 * 2**30, max_workers=8),
        GPU_TEMPLATE,
        {"cache_max_bytes": 200 * 2**30, "extra_env": {"AWS_REGION": "eu-west-1"}},
        id="gpu-host-path-cache",
    ),
    pytest.param(
        PoolSpec(name="gpu-pvc", device="cuda", max_workers=2),
        PoolTemplate(image="registry.example/zeroserve-runtime-vllm:0.1.0", gpus=4),
        {"cache_volume": "pvc", "cache_claim": "zeroserve-cache", "revision_timeout_s": 3600},
        id="gpu-local-pv-cache",
    ),
    pytest.param(
        PoolSpec(name="vllm", device="cuda", max_workers=2),
        PoolTemplate(
            image="registry.example/zeroserve-runtime-vllm:0.1.0",
            gpus=4,
            memory="180Gi",
            env={"VLLM_WORKER_MULTIPROC_METHOD": "spawn"},
            shm_size="16Gi",
        ),
        {},
        id="vllm-shm",
    ),
    pytest.param(
        PoolSpec(name="tolerant"),
        PoolTemplate(
            tolerations=(
                Toleration(key="spot", value="true", effect="NoExecute", toleration_seconds=30),
            )
        ),
        {"namespace": "models", "service_prefix": "zs-", "container_port": 9000},
        id="cpu-toleration-other-namespace",
    ),
]


@pytest.mark.parametrize(("pool", "template", "settings"), CASES)
def test_every_manifest_validates_against_knative_and_kubernetes(pool, template, settings):
    service = build(pool, template, **settings)
    assert knative_service_errors(service) == []
    assert pod_template_errors(service) == []


def test_the_gpu_pool_asks_for_what_it_needs():
    service = build(PoolSpec(name="gpu-l4", device="cuda", max_workers=8), GPU_TEMPLATE)
    spec = service["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["resources"]["limits"] == {"memory": "24Gi", "nvidia.com/gpu": "1"}
    assert container["resources"]["requests"] == {"cpu": "6", "memory": "24Gi"}
    assert spec["nodeSelector"]["zeroserve.io/node-pool"] == "gpu"
    assert spec["tolerations"] == [
        {"operator": "Exists", "key": "nvidia.com/gpu", "effect": "NoSchedule"}
    ]
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["serviceAccountName"] == "zeroserve-runtime"
    assert spec["automountServiceAccountToken"] is False


def test_older_revisions_are_pinned_at_zero_percent():
    service = build()
    pinned = pin_revisions(service, ["zeroserve-default-b", "zeroserve-default-a"] * 2)
    assert pinned["spec"]["traffic"] == [
        {"latestRevision": True, "percent": 100},
        {"revisionName": "zeroserve-default-a", "percent": 0},
        {"revisionName": "zeroserve-default-b", "percent": 0},
    ]
    assert knative_service_errors(pinned) == []
    assert "traffic" not in service["spec"]
    assert pinned["spec"]["template"] == service["spec"]["template"]


def test_pods_are_not_evicted_by_the_cluster_autoscaler():
    """Knative copies the Revision's non-autoscaling annotations to its pods."""
    annotations = build()["spec"]["template"]["metadata"]["annotations"]
    assert annotations[SAFE_TO_EVICT_ANNOTATION] == "false"


def test_pods_say_where_prometheus_scrapes_them():
    """For a Prometheus that discovers pods by annotation: the data plane's port and path."""
    service = build()
    annotations = service["spec"]["template"]["metadata"]["annotations"]
    [container] = service["spec"]["template"]["spec"]["containers"]
    [port] = container["ports"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port["containerPort"])
    assert annotations["prometheus.io/path"] == "/metrics"


def test_a_vllm_pool_gets_its_env_and_a_memory_backed_dev_shm():
    template = PoolTemplate(
        gpus=2,
        env={"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "HOME": "/elsewhere"},
        shm_size="8Gi",
    )
    spec = build(PoolSpec(name="vllm", device="cuda"), template, extra_env={"A": "1"})
    pod = spec["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert env["A"] == "1" and env["HOME"] == "/elsewhere"  # the pool's own env wins
    assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["volumes"]
    plain = build()["spec"]["template"]["spec"]
    assert all(v["name"] != "shm" for v in plain["volumes"])


def test_the_container_is_an_explicit_mode_data_plane_with_a_cache_volume():
    service = build()
    spec = service["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    command = container["command"] + container["args"]
    assert command[:2] == ["zeroserve", "serve"]
    assert command[command.index("--model-control-mode") + 1] == "explicit"
    assert command[command.index("--cache-dir") + 1] == "/var/cache/zeroserve"
    assert command[command.index("--http-port") + 1] == "8080"
    assert command[command.index("--grpc-port") + 1] == "8001"
    # Knative takes one declared port: the gRPC one is served but not declared.
    assert container["ports"] == [{"name": "http1", "containerPort": 8080, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["node-cache"] == "/var/cache/zeroserve"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["node-cache"]["hostPath"] == {
        "path": "/mnt/zeroserve-cache",
        "type": "DirectoryOrCreate",
    }
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["ZEROSERVE_ALLOWED_STORAGE"] == "s3://models/prod,/models"
    assert env["ZEROSERVE_CACHE_DIR"] == "/var/cache/zeroserve"
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False


def test_a_pool_without_grpc_says_so_to_the_data_plane():
    (container,) = build(grpc_port=0)["spec"]["template"]["spec"]["containers"]
    assert container["args"][container["args"].index("--grpc-port") + 1] == "0"


def test_autoscaling_is_gpu_sane_and_starts_at_zero():
    service = build(PoolSpec(name="default", max_workers=5), progress_deadline_s=5400)
    annotations = service["spec"]["template"]["metadata"]["annotations"]
    assert annotations["autoscaling.knative.dev/initial-scale"] == "0"
    assert annotations[MIN_SCALE_ANNOTATION] == "0"
    assert annotations["autoscaling.knative.dev/max-scale"] == "5"
    assert annotations["autoscaling.knative.dev/target-utilization-percentage"] == "100"
    assert annotations["autoscaling.knative.dev/target-burst-capacity"] == "0"
    assert annotations["autoscaling.knative.dev/scale-to-zero-pod-retention-period"] == "0s"
    # Knative's default is 600 s, too short for a GPU node plus a multi-GB image.
    assert annotations["serving.knative.dev/progress-deadline"] == "5400s"
    assert service["spec"]["template"]["spec"]["timeoutSeconds"] == 900
    assert service["metadata"]["labels"]["networking.knative.dev/visibility"] == "cluster-local"


def test_the_revision_name_follows_the_template():
    first = build()
    assert revision_name(first) == revision_name(build())
    assert revision_name(first).startswith("zeroserve-default-")
    changed = build(template=PoolTemplate(memory="9Gi"))
    assert revision_name(changed) != revision_name(first)
    assert len(revision_name(build(PoolSpec(name="a" * 42)))) <= 63


@pytest.mark.parametrize(
    ("pool", "template", "match"),
    [
        pytest.param(
            PoolSpec(name="x", device="cuda"), PoolTemplate(), "no GPUs", id="cuda-without-gpus"
        ),
        pytest.param(PoolSpec(name="x"), PoolTemplate(gpus=1), "asks for GPUs", id="cpu-with-gpus"),
        pytest.param(PoolSpec(name="Bad_Name"), PoolTemplate(), "cannot name", id="bad-name"),
        pytest.param(PoolSpec(name="a" * 43), PoolTemplate(), "at most", id="too-long"),
    ],
)
def test_impossible_pools_are_refused(pool, template, match):
    with pytest.raises(ValueError, match=match):
        build(pool, template)


def test_patches():
    assert min_scale_patch(3, resource_version="42") == {
        "metadata": {"annotations": {MIN_SCALE_ANNOTATION: "3"}, "resourceVersion": "42"}
    }
    assert min_scale_patch(0, resource_version=None) == {
        "metadata": {"annotations": {MIN_SCALE_ANNOTATION: "0"}}
    }
    with pytest.raises(ValueError):
        min_scale_patch(-1, resource_version=None)
    assert deletion_cost_patch(-(2**31)) == {
        "metadata": {"annotations": {DELETION_COST_ANNOTATION: str(-(2**31))}}
    }
    with pytest.raises(ValueError):
        deletion_cost_patch(2**31)


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [({}, 0), ({MIN_SCALE_ANNOTATION: "4"}, 4), ({MIN_SCALE_ANNOTATION: "x"}, 0)],
)
def test_min_scale_of(annotations, expected):
    assert min_scale_of({"metadata": {"annotations": annotations}}) == expected


def test_names_and_selectors():
    assert service_name("gpu-l4", KnativeSettings()) == "zeroserve-gpu-l4"
    assert pool_selector() == "zeroserve.io/pool"
    assert pool_selector("gpu-l4") == "zeroserve.io/pool=gpu-l4"


def test_the_schema_check_catches_mistakes():
    """The validators are not vacuous: a misspelt field and a wrong type both fail."""
    service = build()
    service["spec"]["template"]["spec"]["nodeSelecter"] = {"a": "b"}
    service["spec"]["template"]["spec"]["containerConcurrency"] = "many"
    errors = knative_service_errors(service)
    assert any("nodeSelecter" in e for e in errors)
    assert any("containerConcurrency" in e for e in errors)
    service = build()
    service["spec"]["template"]["spec"]["containers"][0]["resources"]["limitz"] = {}
    assert pod_template_errors(service) != []
