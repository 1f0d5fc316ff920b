"""The activator's settings: one frozen object, loaded once in ``__main__``."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from activator.access_log import AccessLogFormat
from foundation.grpc_limits import GrpcLimits
from foundation.http import ServerLimits


class ActivatorSettings(BaseSettings, ServerLimits, GrpcLimits):
    """How one activator process runs. Environment: ``ZEROSERVE_ACTIVATOR_*``.

    The public server's connection limits are `ServerLimits`' (``max_header_bytes``,
    ``max_headers``, ``header_timeout_s``, ``body_timeout_s``, ``max_connections``); the
    gRPC server's message sizes, call bound, per-stream bound and keepalive are
    `GrpcLimits`' (``grpc_max_receive_bytes``... as Triton's ``--grpc-*`` flags). The
    channels to workers carry the same message sizes the other way.
    """

    model_config = SettingsConfigDict(env_prefix="ZEROSERVE_ACTIVATOR_", frozen=True)

    grpc_frontend: Literal["aio", "h2corn"] = "h2corn"
    """What carries the public gRPC endpoint: ``h2corn`` (`foundation.grpc_front`, as on the
    data plane) or ``aio`` (grpc.aio, which alone carries out the keepalive, ping-strike and
    connection-age settings); the access log is the same on both."""
    grpc_worker_protocol: Literal["grpc-web", "grpc"] = "grpc-web"
    """How unary calls (ModelInfer, ModelMetadata...) reach a worker: ``grpc-web``, one
    HTTP/1.1 request on the pooled keep-alive connections to the worker's HTTP port that
    HTTP requests use (the worker serves gRPC-Web there; the cheaper hop,
    ``bench/grpc_activator.py``), or ``grpc``, a call on a grpc.aio channel to the worker's
    gRPC port. Streams (ModelStreamInfer) always go over grpc.aio channels."""

    host: str = "127.0.0.1"
    """Address the public HTTP server binds."""
    port: int = Field(default=8080, ge=0, le=65535)
    """Port of the public HTTP server; 0 picks a free one."""
    grpc_port: int = Field(default=0, ge=0, le=65535)
    """Port of the public gRPC server (Triton's ``inference.GRPCInferenceService`` for every
    registered model, on ``host``); 0 serves no gRPC, as for ``zeroserve serve``. Triton's
    default is 8001, which a worker on the same machine would claim too."""
    keep_alive_timeout_s: int = Field(default=1830, gt=0)
    """How long the public server keeps an idle client connection open. Longer than the load
    balancer's idle timeout (1800 s on the ALB in deploy/kubernetes/ingress.yaml), as AWS
    requires: a target that closes first races the balancer reusing the connection, and that
    request fails (502). ``max_connections`` bounds what idle connections hold: past it the
    one idle longest is closed to make room."""
    state_url: str = "memory://"
    """Where the control plane keeps its state: ``redis://...`` in a cluster."""

    auth: Literal["keys", "off"] = "keys"
    """``keys``: every model request needs an API key (``Authorization: Bearer <key>``;
    health, server metadata and ``/metrics`` stay open). ``off`` serves anyone, unlimited:
    only for a machine nobody else reaches (it is logged as a warning beyond loopback)."""
    key_cache_ttl_s: float = Field(default=30.0, gt=0)
    """How long a looked-up API key is trusted without the store. Revocations reach every
    activator at once through the store's events; this bounds staleness should those fail."""
    key_cache_max_entries: int = Field(default=10_000, gt=0)
    """Bound on remembered key ids (unknown ones included, so made-up keys cannot grow
    memory)."""
    quota_fallback_s: float = Field(default=5.0, gt=0)
    """After the shared quota counters (the cluster's Redis) fail, how long this activator
    enforces every key's limits on its own before trying them again."""
    quota_store_timeout_s: float = Field(default=0.25, gt=0)
    """The most one shared quota check may take before this activator counts on its own."""
    quota_max_keys: int = Field(default=100_000, gt=0)
    """Keys whose quota counters one activator keeps in memory."""

    buffer_max_requests: int = Field(default=1000, gt=0)
    """Requests one model may have waiting for a replica; one more is answered 429."""
    activation_timeout_s: float = Field(default=120.0, gt=0)
    """How long a request waits for a replica (and an activation call may take) before 503."""
    activation_poll_s: float = Field(default=1.0, gt=0)
    """How often an activator apart from the acting control plane re-reads a model's
    record while its requests wait for an activation, so that a load failing for good is
    answered at once, not at the deadline."""
    release_concurrency: int = Field(default=8, gt=0)
    """Buffered requests in flight at once on each replica while the buffer drains."""
    retry_after_s: int = Field(default=1, ge=0)
    """``Retry-After`` sent with 429 and 503 answers."""
    max_request_bytes: int = Field(default=64 * 2**20, gt=0)
    """Largest request body the activator holds (it keeps bodies to retry and to buffer)."""
    sequence_idle_s: float = Field(default=600.0, gt=0)
    """How long a sequence (a sequence model's correlation ID) stays bound to the replica
    that took its START after its last request; longer than any model's
    ``max_sequence_idle_microseconds``, past which the worker ends the sequence anyway."""
    sequence_max_bindings: int = Field(default=100_000, gt=0)
    """Sequences bound at once; past it the least recently used binding is dropped."""

    upstream_connect_timeout_s: float = Field(default=5.0, gt=0)
    """Opening a connection to a worker; past it the replica counts as gone."""
    upstream_read_timeout_s: float = Field(default=300.0, gt=0)
    """Waiting for the worker's next bytes (the first included) before 504."""
    upstream_write_timeout_s: float = Field(default=30.0, gt=0)
    """Sending one chunk of a request body to the worker."""
    upstream_pool_timeout_s: float = Field(default=5.0, gt=0)
    """Waiting for a free connection when ``upstream_max_connections`` are busy, then 503."""
    upstream_max_connections: int = Field(default=1000, gt=0)
    """Connections to all workers together."""
    upstream_max_keepalive_connections: int = Field(default=200, ge=0)
    """Idle connections kept open for reuse."""
    upstream_keepalive_expiry_s: float = Field(default=4.0, ge=0)
    """Idle connections are closed after this long. Keep it below the workers' keep-alive
    timeout (their ``keep_alive_timeout_s``, 5 s by default), or a request can race the
    worker closing the connection and fail after being sent."""

    replica_quarantine_s: float = Field(default=5.0, ge=0)
    """A replica that refused a connection is left out this long, unless the store removes
    it first; then it is tried again."""
    upstream_stall_s: float = Field(default=1.0, gt=0)
    """A worker with requests waiting this long for an answer's head, and no head from it
    meanwhile, gets a liveness probe from the activator."""
    upstream_probe_timeout_s: float = Field(default=2.0, gt=0)
    """A liveness probe with no 200 within this long fails: the worker's replicas leave this
    activator's routing until a probe succeeds (requests already sent keep waiting)."""
    upstream_probe_interval_s: float = Field(default=1.0, gt=0)
    """Least time between two probes of one worker, while it stalls or is out of routing."""
    model_cache_ttl_s: float = Field(default=2.0, ge=0)
    """How long a looked-up model name (known or unknown) is trusted without the store."""
    model_cache_max_entries: int = Field(default=10_000, gt=0)
    """Bound on remembered names, so requests for random names cannot grow memory."""
    startup_sync_timeout_s: float = Field(default=10.0, ge=0)
    """How long start-up waits for the first list of placements (readiness waits for it
    regardless); requests that come earlier would wake models that are already up."""
    resubscribe_delay_s: float = Field(default=1.0, gt=0)
    """Pause before subscribing to placements again after the subscription failed."""
    traffic_report_interval_s: float = Field(default=1.0, gt=0)
    """How often per-model concurrency and last-request time go to the control plane."""

    exit_timeout_s: float = Field(default=30.0, ge=0)
    """How long in-flight requests may take to finish on shutdown."""
    readiness_propagation_s: float = Field(default=0.0, ge=0)
    """Pause between failing readiness and refusing connections on shutdown."""

    access_log: bool = True
    """Write one line per request (health probes and metric scrapes aside) to the
    ``zeroserve.access`` logger: time, request id, key id, model, protocol, status,
    latency, time waited for an activation, bytes in and out."""
    access_log_format: AccessLogFormat = AccessLogFormat.TEXT
    """``text`` (``key=value`` pairs) or ``json`` (one object a line)."""

    cloudwatch_enabled: bool = False
    """Publish request metrics to CloudWatch (PutMetricData, namespace ``zeroserve``) with
    boto3's standard AWS environment; see ``foundation.cloudwatch``."""
    cloudwatch_flush_interval_s: float = Field(default=60.0, gt=0)
    """How often buffered CloudWatch values are sent (60 s: CloudWatch's resolution)."""
    cloudwatch_max_values: int = Field(default=20_000, gt=0)
    """Distinct CloudWatch values (per minute and metric, four significant digits) held
    between two sends; past it new ones are dropped, never waited for."""

    @model_validator(mode="after")
    def _check_bounds(self) -> Self:
        if self.upstream_max_keepalive_connections > self.upstream_max_connections:
            raise ValueError("upstream_max_keepalive_connections exceeds upstream_max_connections")
        return self
