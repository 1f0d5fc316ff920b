"""Pure builders of what the knative backend sends: the pool's Knative Service and patches.

No I/O here: ``make_service`` turns a pool, its pod template and the settings into the JSON
the API server gets, so every manifest can be checked against Knative's and Kubernetes'
schemas in tests (``tests/control_plane/knative/test_manifests.py``).

Choices that differ from Knative's defaults, and why (shared/research/knative-kserve.md §1.5–1.8):

- ``initial-scale: 0``: a new Revision must not grab a GPU before anything asks for it (Knative
  starts one pod; needs ``allow-zero-initial-scale`` in config-autoscaler).
- ``min-scale`` is how the control plane sets the replicas: it is patched on the *Revision*,
  which Knative syncs to its PodAutoscaler without stamping a new Revision. The template keeps
  ``0`` so that re-applying the Service never changes the replicas.
- ``target-utilization-percentage: 100`` and ``target-burst-capacity: 0``: requests go from our
  activator straight to the pods, so Knative sees no load of its own; these keep its KPA from
  adding pods (70 % would mean 2 pods for 1 client) and its activator out of any path.
- ``serving.knative.dev/progress-deadline`` well above 600 s: GPU node provisioning, a
  multi-GB image pull and the first weight fetch together easily take longer, and Knative
  marks a revision failed and scales it to zero when this runs out.
- ``networking.knative.dev/visibility: cluster-local``: the pool is never exposed on Knative's
  ingress; the activator is the only front door.
- ``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`` (Knative copies a Revision's
  non-autoscaling annotations to its pods): a pod holds loaded models the control plane
  placed there, so the cluster autoscaler must not evict it to consolidate nodes; the
  control plane scales pools down itself.
- The data plane's gRPC port is in its arguments but not among the container's ports:
  Knative takes one port per Service (the one its queue-proxy fronts); the activator reaches
  pods at their IP on both ports, bypassing the queue-proxy as it does for HTTP.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from control_plane.backends.base import PoolSpec
from control_plane.backends.knative.settings import KnativeSettings, PoolTemplate, Toleration

__all__ = [
    "API_VERSION",
    "CONTAINER_NAME",
    "DELETION_COST_ANNOTATION",
    "GROUP",
    "MIN_SCALE_ANNOTATION",
    "POOL_LABEL",
    "REPOSITORY_DIR",
    "RUNTIME_UID",
    "SAFE_TO_EVICT_ANNOTATION",
    "SHM_DIR",
    "VERSION",
    "deletion_cost_patch",
    "make_service",
    "min_scale_of",
    "min_scale_patch",
    "pin_revisions",
    "pool_selector",
    "revision_name",
    "service_name",
]

GROUP = "serving.knative.dev"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
POOL_LABEL = "zeroserve.io/pool"
"""On the Service, its Revisions and their pods: the pool's name."""
CONTAINER_NAME = "runtime"
MIN_SCALE_ANNOTATION = "autoscaling.knative.dev/min-scale"
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
"""Pods with a lower cost go first when the ReplicaSet shrinks (Kubernetes >= 1.22)."""
SAFE_TO_EVICT_ANNOTATION = "cluster-autoscaler.kubernetes.io/safe-to-evict"
SHM_DIR = "/dev/shm"
REPOSITORY_DIR = "/srv/zeroserve/repository"
"""The empty model repository the data plane starts with (models come by storage URI)."""
RUNTIME_UID = 10001
"""The non-root user of the runtime images (docker/)."""

_TMP_DIR = "/tmp"
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Revision names are "<service>-<10 hex>" and must fit a 63-character label.
_HASH_CHARS = 10
_MAX_SERVICE_NAME = 63 - 1 - _HASH_CHARS


def service_name(pool: str, settings: KnativeSettings) -> str:
    """The Knative Service of ``pool``; ValueError when the name cannot be one."""
    name = f"{settings.service_prefix}{pool}"
    if len(name) > _MAX_SERVICE_NAME or not _DNS_LABEL.match(name):
        raise ValueError(
            f"'{name}' cannot name a Knative Service: lowercase letters, digits and '-', "
            f"starting with a letter, at most {_MAX_SERVICE_NAME} characters"
        )
    return name


def pool_selector(pool: str | None = None) -> str:
    """Label selector of one pool's pods, or of every pool's (``pool`` None)."""
    return POOL_LABEL if pool is None else f"{POOL_LABEL}={pool}"


def make_service(
    pool: PoolSpec,
    template: PoolTemplate,
    settings: KnativeSettings,
    *,
    allowed_storage: Sequence[str] = (),
) -> dict[str, Any]:
    """The Knative Service (``serving.knative.dev/v1``) whose pods are ``pool``'s workers.

    Its revision is named after a hash of its template, so applying the same manifest again
    changes nothing and a changed one stamps exactly one new Revision.
    Raises ValueError when the pool's device class and the template's GPUs disagree.
    """
    if pool.device == "cuda" and template.gpus < 1:
        raise ValueError(f"pool '{pool.name}' runs models on cuda but its template has no GPUs")
    if pool.device != "cuda" and template.gpus > 0:
        raise ValueError(f"pool '{pool.name}' is a {pool.device} pool but asks for GPUs")
    name = service_name(pool.name, settings)
    labels = {
        "app.kubernetes.io/name": "zeroserve",
        "app.kubernetes.io/component": "runtime",
        POOL_LABEL: pool.name,
    }
    revision_template: dict[str, Any] = {
        "metadata": {
            "labels": dict(labels),
            "annotations": _revision_annotations(pool, settings),
        },
        "spec": _revision_spec(pool, template, settings, allowed_storage),
    }
    digest = hashlib.sha256(json.dumps(revision_template, sort_keys=True).encode()).hexdigest()
    revision_template["metadata"]["name"] = f"{name}-{digest[:_HASH_CHARS]}"
    return {
        "apiVersion": API_VERSION,
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {**labels, "networking.knative.dev/visibility": "cluster-local"},
        },
        "spec": {"template": revision_template},
    }


def pin_revisions(service: dict[str, Any], revisions: Sequence[str]) -> dict[str, Any]:
    """``service`` with its traffic pinned to ``revisions`` as well as its latest Revision.

    The backend never routes through Knative, so the percentages mean nothing; what matters
    is that a Revision named in the traffic, even at 0 %, is routed (Knative's labeler marks
    it ``routingState: active``), so its PodAutoscaler is reachable and keeps ``min-scale``
    pods. A Revision left out is unreachable and Knative scales it to zero whatever its
    ``min-scale``: that is how a changed template would lose the previous Revision's pods,
    and their loaded models, at once.
    """
    pinned = {**service, "spec": dict(service["spec"])}
    pinned["spec"]["traffic"] = [
        {"latestRevision": True, "percent": 100},
        *({"revisionName": name, "percent": 0} for name in sorted(set(revisions))),
    ]
    return pinned


def revision_name(service: dict[str, Any]) -> str:
    """The Revision a manifest from ``make_service`` stamps."""
    return str(service["spec"]["template"]["metadata"]["name"])


def min_scale_of(revision: dict[str, Any]) -> int:
    """The Revision's current ``min-scale`` (0 when unset or unreadable)."""
    annotations = revision.get("metadata", {}).get("annotations") or {}
    try:
        return max(int(annotations.get(MIN_SCALE_ANNOTATION, "0")), 0)
    except ValueError:
        return 0


def min_scale_patch(count: int, *, resource_version: str | None) -> dict[str, Any]:
    """A merge patch of a Revision's ``min-scale``; with ``resource_version`` the API server
    applies it only if nobody changed the Revision since it was read (else 409)."""
    if count < 0:
        raise ValueError("min-scale cannot be negative")
    metadata: dict[str, Any] = {"annotations": {MIN_SCALE_ANNOTATION: str(count)}}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {"metadata": metadata}


def deletion_cost_patch(cost: int) -> dict[str, Any]:
    """A merge patch of a pod's deletion cost (int32)."""
    if not -(2**31) <= cost < 2**31:
        raise ValueError("the pod deletion cost is an int32")
    return {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}}


def _revision_annotations(pool: PoolSpec, settings: KnativeSettings) -> dict[str, str]:
    prefix = "autoscaling.knative.dev/"
    return {
        f"{prefix}class": "kpa.autoscaling.knative.dev",
        f"{prefix}metric": "concurrency",
        f"{prefix}initial-scale": "0",
        MIN_SCALE_ANNOTATION: "0",
        f"{prefix}max-scale": str(pool.max_workers),
        f"{prefix}target-utilization-percentage": "100",
        f"{prefix}target-burst-capacity": "0",
        f"{prefix}scale-down-delay": "0s",
        f"{prefix}window": f"{settings.stable_window_s}s",
        f"{prefix}scale-to-zero-pod-retention-period": f"{settings.scale_to_zero_retention_s}s",
        "serving.knative.dev/progress-deadline": f"{settings.progress_deadline_s}s",
        SAFE_TO_EVICT_ANNOTATION: "false",
        # For a Prometheus that discovers pods by annotation (the common kubernetes-pods
        # job) rather than through deploy/kubernetes' PodMonitor: every worker's nv_*
        # families, whatever scrapes them. Knative copies these to the pods.
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(settings.container_port),
        "prometheus.io/path": "/metrics",
    }


def _revision_spec(
    pool: PoolSpec,
    template: PoolTemplate,
    settings: KnativeSettings,
    allowed_storage: Sequence[str],
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        # 0: no per-pod request limit from Knative; the data plane bounds its own queues.
        "containerConcurrency": 0,
        "timeoutSeconds": settings.revision_timeout_s,
        "responseStartTimeoutSeconds": settings.revision_timeout_s,
        "serviceAccountName": settings.service_account,
        # The pods read S3 through IRSA's projected token, which this does not remove; they
        # never call the Kubernetes API, so they get no token for it.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [_container(template, settings, allowed_storage)],
        "volumes": _volumes(template, settings),
    }
    if template.node_selector:
        spec["nodeSelector"] = dict(sorted(template.node_selector.items()))
    if template.tolerations:
        spec["tolerations"] = [_toleration(t) for t in template.tolerations]
    if template.runtime_class_name:
        spec["runtimeClassName"] = template.runtime_class_name
    return spec


def _container(
    template: PoolTemplate, settings: KnativeSettings, allowed_storage: Sequence[str]
) -> dict[str, Any]:
    port = settings.container_port
    env = {
        "ZEROSERVE_CACHE_DIR": settings.cache_dir,
        "ZEROSERVE_DATA_PLANE_READINESS_PROPAGATION_S": f"{settings.readiness_propagation_s:g}",
        # The root file system is read-only; libraries that cache under $HOME write to /tmp.
        "HOME": _TMP_DIR,
    }
    if allowed_storage:
        env["ZEROSERVE_ALLOWED_STORAGE"] = ",".join(allowed_storage)
    if settings.cache_max_bytes is not None:
        env["ZEROSERVE_CACHE_MAX_BYTES"] = str(settings.cache_max_bytes)
    env.update(settings.extra_env)
    env.update(template.env)
    limits: dict[str, str] = {"memory": template.memory}
    if template.gpus:
        # Extended resources need only the limit; Kubernetes sets the request to match.
        limits["nvidia.com/gpu"] = str(template.gpus)
    return {
        "name": CONTAINER_NAME,
        "image": template.image,
        "command": ["zeroserve"],
        "args": [
            "serve",
            "--model-repository",
            REPOSITORY_DIR,
            "--model-control-mode",
            "explicit",
            "--host",
            "0.0.0.0",
            "--http-port",
            str(port),
            # Given even when 0: the data plane's own default is Triton's 8001.
            "--grpc-port",
            str(settings.grpc_port),
            "--cache-dir",
            settings.cache_dir,
        ],
        # Only the HTTP port: Knative allows one. The gRPC port is reached at the pod's IP
        # without being declared (see KnativeSettings.grpc_port; pods.py reads it back).
        "ports": [{"name": "http1", "containerPort": port, "protocol": "TCP"}],
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "resources": {
            "requests": {"cpu": template.cpu, "memory": template.memory},
            "limits": limits,
        },
        # No periodSeconds: Knative's queue-proxy then probes every 50 ms until the first
        # success, which shortens every cold start by up to a probe period.
        "readinessProbe": {
            "httpGet": {"path": "/v2/health/ready", "port": port},
            "successThreshold": 1,
        },
        # Liveness stays cheap and answers during loads; a dead engine exits the process.
        "livenessProbe": {
            "httpGet": {"path": "/v2/health/live", "port": port},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
        "volumeMounts": [
            {"name": "node-cache", "mountPath": settings.cache_dir},
            {"name": "model-repository", "mountPath": REPOSITORY_DIR},
            {"name": "tmp", "mountPath": _TMP_DIR},
            *([{"name": "shm", "mountPath": SHM_DIR}] if template.shm_size else []),
        ],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_UID,
            "runAsGroup": RUNTIME_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _volumes(template: PoolTemplate, settings: KnativeSettings) -> list[dict[str, Any]]:
    if settings.cache_volume == "pvc":
        cache: dict[str, Any] = {
            "name": "node-cache",
            "persistentVolumeClaim": {"claimName": settings.cache_claim},
        }
    else:
        cache = {
            "name": "node-cache",
            "hostPath": {"path": settings.cache_host_path, "type": "DirectoryOrCreate"},
        }
    volumes = [
        cache,
        {"name": "model-repository", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if template.shm_size:
        volumes.append(
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": template.shm_size}}
        )
    return volumes


def _toleration(toleration: Toleration) -> dict[str, Any]:
    doc: dict[str, Any] = {"operator": toleration.operator}
    if toleration.key is not None:
        doc["key"] = toleration.key
    if toleration.value is not None:
        doc["value"] = toleration.value
    if toleration.effect is not None:
        doc["effect"] = toleration.effect
    if toleration.toleration_seconds is not None:
        doc["tolerationSeconds"] = toleration.toleration_seconds
    return doc
