"""The knative backend's settings: one frozen object, loaded in the composition root.

Environment: ``ZEROSERVE_KNATIVE_*``; ``pools`` and ``extra_env`` are JSON there, e.g.
``ZEROSERVE_KNATIVE_POOLS='{"gpu-l4": {"image": "...", "gpus": 1, "node_selector": {...}}}'``.
The control plane's own settings still decide which pool it manages, its device class
(``worker_device``), its size (``max_workers``) and the workers' timeouts; these settings say
what that pool's pods look like and how the backend reaches the Kubernetes API.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["KnativeSettings", "PoolTemplate", "Toleration"]

# Kubernetes resource quantities ("500m", "16Gi", "2"): checked here so that a typo fails at
# start, not when the API server rejects the Service.
_QUANTITY = re.compile(r"^(\d+(\.\d+)?|\.\d+)([eE][+-]?\d+|[numkMGTPE]|[KMGTPE]i)?$")
# Ports Knative keeps for its queue-proxy and profiling (pkg/apis/serving/k8s_validation.go).
_RESERVED_PORTS = frozenset({8008, 8012, 8013, 8022, 9090, 9091})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Toleration(BaseModel):
    """One Kubernetes toleration, e.g. for the GPU nodes' ``nvidia.com/gpu`` taint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)
    """Only with ``effect: NoExecute``: how long the pod stays on a node tainted after it."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("a toleration with operator Exists takes no value")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds needs effect NoExecute")
        return self


class PoolTemplate(BaseModel):
    """What the pods of one runtime pool look like: image × device class, and where they go."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = "ghcr.io/zeroserve/runtime-cuda:0.1.0"
    """Runtime image (``docker/runtime-cuda.Dockerfile`` or ``docker/runtime-vllm.Dockerfile``);
    pin it by digest in production."""
    gpus: int = Field(default=0, ge=0, le=16)
    """``nvidia.com/gpu`` per pod; 0 for a CPU pool, at least 1 for a ``cuda`` pool."""
    cpu: str = "2"
    """CPU request of the runtime container (no limit: throttling a data plane costs latency)."""
    memory: str = "8Gi"
    """Memory request and limit of the runtime container."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Labels the node must carry (a GPU node group); needs ``kubernetes.podspec-nodeselector``."""
    tolerations: tuple[Toleration, ...] = ()
    """Taints the pods tolerate; needs ``kubernetes.podspec-tolerations``."""
    runtime_class_name: str | None = None
    """e.g. ``nvidia`` where the cluster needs it; needs ``kubernetes.podspec-runtimeclassname``."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of this pool's runtime container, over ``extra_env`` (a vLLM pool's
    ``VLLM_WORKER_MULTIPROC_METHOD=spawn``)."""
    shm_size: str | None = None
    """Size of a memory-backed ``/dev/shm`` (the container runtime's default is 64 MiB, too
    small for vLLM's and NCCL's shared-memory buffers across GPUs); None: the default. It
    counts against the container's memory limit."""

    @field_validator("cpu", "memory", "shm_size")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        if value is not None and not _QUANTITY.match(value):
            raise ValueError(f"'{value}' is not a Kubernetes quantity (like 500m, 2, 16Gi)")
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if not value or any(c.isspace() for c in value):
            raise ValueError("the image must be a non-empty reference without spaces")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return _checked_env_names(value)


class KnativeSettings(BaseSettings):
    """How the knative backend runs. Environment: ``ZEROSERVE_KNATIVE_*``."""

    model_config = SettingsConfigDict(env_prefix="ZEROSERVE_KNATIVE_", frozen=True)

    namespace: str = "zeroserve"
    """Namespace of the runtime pools' Knative Services and pods."""
    knative_namespace: str = "knative-serving"
    """Where Knative Serving keeps its config maps (read once at start)."""
    kubeconfig: Path | None = None
    """A kubeconfig file to use; None: the pod's own service account (in-cluster)."""
    config_check: Literal["strict", "warn", "off"] = "strict"
    """At start: refuse to run (``strict``) or log (``warn``) when Knative's configuration
    lacks what the pools need; ``off`` skips the check (no read access to knative-serving)."""
    request_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """Bound on one Kubernetes API call (connect and read)."""
    api_threads: int = Field(default=4, ge=1, le=64)
    """Threads running the (blocking) Kubernetes client calls."""
    pod_poll_interval_s: float = Field(default=1.0, gt=0, le=60)
    """Period of the pod listing that finds workers and notices lost ones."""
    service_prefix: str = "zeroserve-"
    """Knative Service of pool ``P``: ``<service_prefix>P``."""
    service_account: str = "zeroserve-runtime"
    """Service account of the runtime pods: the one allowed to read the model bucket (IRSA)."""
    container_port: int = Field(default=8080, ge=1, le=65535)
    """Port the data plane listens on inside the pod (not one Knative reserves)."""
    grpc_port: int = Field(default=8001, ge=0, le=65535)
    """Port of the data plane's gRPC server inside the pod (Triton's default), which the
    activator reaches at the pod's IP as it does ``container_port``; 0 serves no gRPC. Not
    declared in the container's ports: Knative takes exactly one, the port its queue-proxy
    and ingress carry (HTTP), and an undeclared port is reachable all the same."""
    cache_dir: str = "/var/cache/zeroserve"
    """Node cache folder inside the pods (the cache volume's mount path)."""
    cache_volume: Literal["host-path", "pvc"] = "host-path"
    """The node-local cache: a host folder, or a PersistentVolumeClaim (a local PV)."""
    cache_host_path: str = "/mnt/zeroserve-cache"
    """Host folder of the cache (``host-path``); the node must let uid 10001 write it, and
    must have it before the pods come (kubelet would create a missing one owned by root).
    This default is for clusters prepared by hand; infra/terraform sets
    ``/mnt/k8s-disks/0/zeroserve-cache``, the GPU nodes' instance-store NVMe."""
    cache_claim: str = ""
    """PersistentVolumeClaim of the cache (``pvc``)."""
    cache_max_bytes: int | None = Field(default=None, gt=0)
    """Bound on the node cache (the data plane's ``ZEROSERVE_CACHE_MAX_BYTES``); None: its own."""
    progress_deadline_s: int = Field(default=3600, ge=60, le=86400)
    """How long a new pod may take to become ready before Knative gives up on it. Knative's
    600 s is too short for a GPU node to be provisioned and a multi-GB image pulled."""
    revision_timeout_s: int = Field(default=900, ge=1, le=86400)
    """``timeoutSeconds`` and ``responseStartTimeoutSeconds`` of the pods; Knative also makes
    it their termination grace period. Must not exceed config-defaults'
    ``max-revision-timeout-seconds`` (checked at start)."""
    stable_window_s: int = Field(default=6, ge=6, le=3600)
    """Knative's autoscaling window. The control plane sets the replicas through
    ``min-scale``; a short window makes Knative follow it down promptly."""
    scale_to_zero_retention_s: int = Field(default=0, ge=0, le=3600)
    """How long Knative keeps a pool's last pod after the control plane let it go; 0 because
    the control plane's reaper already waited ``pool_grace_period_s``."""
    readiness_propagation_s: float = Field(default=5.0, ge=0, le=300)
    """The pods' pause between failing readiness and refusing requests when stopped."""
    extra_env: dict[str, str] = Field(default_factory=dict)
    """More environment for the runtime container (``AWS_REGION``, ``ZEROSERVE_*``)."""
    pools: dict[str, PoolTemplate] = Field(default_factory=lambda: {"default": PoolTemplate()})
    """Pool name -> the template of its pods."""

    @field_validator("container_port", "grpc_port")
    @classmethod
    def _port(cls, value: int) -> int:
        if value in _RESERVED_PORTS:
            raise ValueError(f"port {value} is reserved by Knative ({sorted(_RESERVED_PORTS)})")
        return value

    @field_validator("cache_dir", "cache_host_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must be an absolute path")
        return value

    @field_validator("extra_env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return _checked_env_names(value)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.cache_volume == "pvc" and not self.cache_claim:
            raise ValueError("cache_volume 'pvc' needs cache_claim")
        if self.grpc_port == self.container_port:
            raise ValueError("grpc_port and container_port must differ")
        return self


def _checked_env_names(value: dict[str, str]) -> dict[str, str]:
    bad = [name for name in value if not _ENV_NAME.match(name)]
    if bad:
        raise ValueError(f"not environment variable names: {bad}")
    return value
