"""Pure reading of Kubernetes pod documents into what the knative backend needs of a worker.

The documents are the API server's JSON (camelCase), as listed by ``api.KubeApi.list_pods``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from control_plane.backends.knative.manifests import CONTAINER_NAME, POOL_LABEL

__all__ = ["PodView", "read_pod", "read_pods"]


@dataclass(frozen=True, slots=True)
class PodView:
    """One runtime pod as the backend sees it."""

    name: str
    pool: str
    ip: str | None
    port: int
    is_ready: bool
    """The Ready condition is True (the data plane answered ``/v2/health/ready``)."""
    is_terminating: bool
    """Deletion has begun (``deletionTimestamp`` set): no new work may go there."""
    phase: str
    restarts: int
    """Restarts of the runtime container: each one lost every model it held."""
    node: str | None = None
    revision: str | None = None
    started_at: float = 0.0
    """Wall-clock seconds since the epoch when the pod started; 0 when unknown."""
    grpc_port: int = 0
    """The runtime's gRPC port (its ``--grpc-port`` argument); 0 when it serves none."""
    problem: str | None = None
    """Why a pod that is not ready is stuck, when Kubernetes says (unschedulable, image pull
    back-off, crash loop): what a failed worker start reports."""

    @property
    def is_gone(self) -> bool:
        """The pod can never serve again (terminating, or its phase is final)."""
        return self.is_terminating or self.phase in ("Succeeded", "Failed")

    @property
    def worker_id(self) -> str:
        """The worker's id: the pod's name, and a new one after each container restart
        (the restarted process is a new, empty worker)."""
        return self.name if self.restarts == 0 else f"{self.name}-r{self.restarts}"

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def grpc_address(self) -> str:
        """``host:port`` of the runtime's gRPC server; empty when it serves none."""
        if not self.grpc_port or not self.ip:
            return ""
        return f"{self._host}:{self.grpc_port}"

    @property
    def _host(self) -> str:
        host = self.ip or ""
        return f"[{host}]" if ":" in host else host


def read_pods(pod_list: Mapping[str, Any], *, default_port: int) -> list[PodView]:
    """Every zeroserve runtime pod of a ``PodList`` document."""
    views = (read_pod(item, default_port=default_port) for item in pod_list.get("items") or [])
    return [v for v in views if v is not None]


def read_pod(pod: Mapping[str, Any], *, default_port: int) -> PodView | None:
    """The pod as a ``PodView``; None when it belongs to no pool."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    pool = labels.get(POOL_LABEL)
    if not pool:
        return None
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    is_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    restarts = 0
    for container in status.get("containerStatuses") or []:
        if container.get("name") == CONTAINER_NAME:
            restarts = int(container.get("restartCount") or 0)
    return PodView(
        name=str(metadata.get("name", "")),
        pool=str(pool),
        ip=status.get("podIP") or None,
        port=_port(spec, default_port),
        is_ready=is_ready,
        is_terminating=metadata.get("deletionTimestamp") is not None,
        phase=str(status.get("phase") or "Unknown"),
        restarts=restarts,
        node=spec.get("nodeName"),
        revision=labels.get("serving.knative.dev/revision"),
        started_at=_timestamp(status.get("startTime")),
        problem=None if is_ready else _problem(conditions, status),
        grpc_port=_grpc_port(spec),
    )


def _problem(conditions: list[Mapping[str, Any]], status: Mapping[str, Any]) -> str | None:
    for condition in conditions:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"not scheduled: {condition.get('reason')}: {condition.get('message', '')}"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating"):
            return f"container {container.get('name')}: {waiting.get('reason')}: " + str(
                waiting.get("message", "")
            )
    return None


def _port(spec: Mapping[str, Any], default: int) -> int:
    for container in spec.get("containers") or []:
        if container.get("name") == CONTAINER_NAME:
            for port in container.get("ports") or []:
                if port.get("containerPort"):
                    return int(port["containerPort"])
    return default


def _grpc_port(spec: Mapping[str, Any]) -> int:
    """The runtime's ``--grpc-port`` argument (manifests.py puts it there: the port is not
    declared among the container's ports); 0 when absent or unreadable."""
    for container in spec.get("containers") or []:
        if container.get("name") == CONTAINER_NAME:
            args = [str(a) for a in container.get("args") or []]
            if "--grpc-port" in args[:-1]:
                value = args[args.index("--grpc-port") + 1]
                return int(value) if value.isdigit() and int(value) <= 65535 else 0
    return 0


def _timestamp(value: object) -> float:
    if not isinstance(value, str):
        return 0.0
    try:
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return 0.0
