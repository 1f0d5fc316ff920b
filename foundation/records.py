"""The platform's records: what is registered, where it runs, how it got there.

Plain frozen dataclasses with JSON round trips. The control plane writes them to the state
store; the activator reads them from it (placements, models) and writes its traffic
reports and first responses. They live here, below both, so that neither of the two
imports the other. Names follow the admin API's JSON fields.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Self


@dataclass(frozen=True, slots=True)
class ScalingSpec:
    """How many replicas a model may have and when it goes idle."""

    min_replicas: int = 0
    """0 means scale to zero: with no traffic the model is unloaded."""
    max_replicas: int = 1
    target_concurrency: float = 8.0
    """In-flight requests per replica the autoscaler aims for."""
    idle_timeout_s: float = 300.0
    """No in-flight requests for this long -> the model loses its placements and unloads."""
    sleep_after_s: float = 0.0
    """No in-flight requests for this long -> its replicas sleep (LLM engines: KV cache
    freed, weights in host memory) until a request wakes them or ``idle_timeout_s`` unloads
    them; 0 never sleeps. Below ``idle_timeout_s`` when set."""
    policy: str = "fixed"
    """Keep-alive policy: ``fixed`` unloads after ``idle_timeout_s``; ``adaptive`` learns
    the model's idle times and unloads sooner, or pre-warms it before its predicted next
    request, with ``idle_timeout_s`` as the longest it keeps a replica idle."""


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """What one replica needs from a worker."""

    device: str = "cpu"
    """``cpu`` or ``cuda``."""
    memory_bytes: int = 0
    """Estimate of the memory one loaded replica takes; 0 = unknown (treated as small)."""


@dataclass(frozen=True, slots=True)
class ModelFailure:
    """Why a model's load failed for good, and when: no activation of it starts until its
    registration changes or it is loaded on purpose (``models load``)."""

    reason: str
    """The worker's own words for the failed load."""
    failed_at: float
    """Wall-clock seconds since the epoch."""


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """A registered model."""

    name: str
    storage_uri: str
    backend: str = ""
    platform: str = ""
    config: dict[str, Any] | None = None
    """Triton ModelConfig fields as JSON; None when the stored model has config.pbtxt."""
    bls_models: tuple[str, ...] = ()
    """Models this one calls through BLS: placed, loaded and unloaded with it on its worker
    (its code names them, which the control plane does not read)."""
    scaling: ScalingSpec = field(default_factory=ScalingSpec)
    resources: ResourceSpec = field(default_factory=ResourceSpec)
    generation: int = 1
    """Bumped on every update, so placements of an older generation can be told apart."""
    created_at: float = 0.0
    """Wall-clock seconds since the epoch."""
    failure: ModelFailure | None = None
    """Set when a load of this generation failed for good (a config or layout error,
    missing files, a model's ``initialize`` raising); cleared by a change that reloads and
    by an explicit load."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        failure = doc.get("failure")
        return cls(
            **{
                **doc,
                "bls_models": tuple(doc.get("bls_models", ())),
                "scaling": ScalingSpec(**doc.get("scaling", {})),
                "resources": ResourceSpec(**doc.get("resources", {})),
                "failure": ModelFailure(**failure) if failure else None,
            }
        )


class WorkerState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A runtime worker (a ``zeroserve serve`` process or a pod)."""

    id: str
    url: str
    """Base URL of the worker's data plane, e.g. ``http://127.0.0.1:8123``."""
    pool: str = "default"
    device: str = "cpu"
    memory_bytes: int = 0
    """Capacity for models; 0 = unbounded."""
    state: WorkerState = WorkerState.STARTING
    started_at: float = 0.0
    grpc_address: str = ""
    """``host:port`` of the worker's gRPC server (Triton's inference service), e.g.
    ``127.0.0.1:8124``; empty when it serves no gRPC."""
    start_method: str = ""
    """How its process came about: ``forked`` (from the local worker template), ``spawned``
    (a new interpreter); empty where the backend does not say (pods)."""
    boot_s: float | None = None
    """Seconds from its process existing to its first answer to a liveness probe (a spawned
    worker's imports included); None where the backend does not say."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        return cls(**{**doc, "state": WorkerState(doc.get("state", "starting"))})


@dataclass(frozen=True, slots=True)
class Placement:
    """Model ``model`` is loaded and READY on worker ``worker_id``, reachable at ``url`` (and
    by gRPC at ``grpc_address`` when the worker serves it)."""

    model: str
    worker_id: str
    url: str
    generation: int = 1
    since: float = 0.0
    grpc_address: str = ""
    """The worker's ``WorkerRecord.grpc_address``; empty when it serves no gRPC (records
    written before workers served gRPC have none either)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        return cls(**doc)


class PlacementEventKind(enum.StrEnum):
    ADDED = "added"
    REMOVED = "removed"
    RESYNC = "resync"
    """The subscription (re)connected: re-read every placement, events may have been missed."""


@dataclass(frozen=True, slots=True)
class PlacementEvent:
    kind: PlacementEventKind
    placement: Placement | None = None


@dataclass(frozen=True, slots=True)
class TrafficReport:
    """What one activator saw of one model: requests in flight now and the last arrival."""

    model: str
    activator_id: str
    in_flight: int
    last_request_at: float
    """Wall-clock seconds since the epoch."""
    reported_at: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        return cls(**doc)


@dataclass(frozen=True, slots=True)
class FirstResponse:
    """An activator's first answered request of a cold start: what closes its timeline.

    Sent once per burst, by each activator whose buffered requests waited for an
    activation, when the first of them released to the new replica got its response.
    """

    model: str
    activator_id: str
    worker_id: str
    """The worker whose replica answered (the activation that placed it is the one closed)."""
    responded_at: float
    """Wall-clock seconds since the epoch when the response's status line arrived."""
    waited_s: float
    """Seconds from the activator asking for the activation to that response."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        return cls(**doc)
