"""The limits and keepalive of a zeroserve gRPC server, and the gRPC core options that
carry them: what `ServerLimits` is for HTTP servers.

The keepalive fields are Triton's ``--grpc-keepalive-*`` and ``--grpc-http2-*`` flags, with
Triton's defaults, and the TLS fields its ``--grpc-use-ssl*``, ``--grpc-server-cert``,
``--grpc-server-key`` and ``--grpc-root-cert`` (`foundation.grpc_tls` reads the files).
Message sizes are bounded (Triton takes up to 2 GiB in).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_INT32_MAX: Final = 2**31 - 1
_UNSET: Final = 0


class GrpcLimits(BaseModel):
    """The bounds and keepalive a zeroserve gRPC server puts on its clients' connections.

    Mixed into each server's settings (``class DataPlaneSettings(BaseSettings, ...,
    GrpcLimits)``), so each reads them under its own environment prefix, e.g.
    ``ZEROSERVE_DATA_PLANE_GRPC_MAX_RECEIVE_BYTES``; the port is each server's own field.
    """

    model_config = ConfigDict(frozen=True)

    grpc_frontend: Literal["aio", "h2corn"] = "h2corn"
    """What carries gRPC: ``h2corn`` (Rust HTTP/2 under zeroserve's own gRPC layer,
    `foundation.grpc_front`: 1.3-6x less server CPU per call) or ``aio`` (grpcio's
    grpc.aio server, which alone carries out the keepalive, ping-strike and connection-age
    settings below: see docs/operating/grpc.md)."""
    grpc_http2_max_concurrent_streams: int = Field(default=256, ge=1, le=_INT32_MAX)
    """Calls at once on one HTTP/2 connection (SETTINGS_MAX_CONCURRENT_STREAMS), for the
    ``h2corn`` front end; grpc.aio sets none."""
    grpc_h2corn_threads: int = Field(default=1, ge=1, le=64)
    """Threads doing the ``h2corn`` front end's socket I/O and HTTP/2 framing (its
    handlers run on the event loop)."""

    grpc_max_receive_bytes: int = Field(default=64 * 2**20, ge=1024, le=_INT32_MAX)
    """Largest request message; past it the call fails with RESOURCE_EXHAUSTED before the
    message is read whole. Triton takes up to 2 GiB; the default matches HTTP's input limit
    (``--http-max-input-size``), so the two transports take the same requests."""
    grpc_max_send_bytes: int = Field(default=_INT32_MAX, ge=1024, le=_INT32_MAX)
    """Largest response message (gRPC's own ceiling, Triton's too); a larger one fails the
    call with RESOURCE_EXHAUSTED."""
    grpc_max_concurrent_rpcs: int = Field(default=4096, gt=0)
    """Calls served at once, streams included; one more fails with RESOURCE_EXHAUSTED."""
    grpc_stream_max_in_flight: int = Field(default=128, gt=0)
    """Requests of one ModelStreamInfer stream running or answered but not yet sent; the
    stream is not read further until one is sent, so a client that does not read its
    answers is slowed down rather than buffered without bound."""
    grpc_keepalive_time_ms: int = Field(default=7_200_000, gt=0)
    """Period after which the server pings an idle connection (``--grpc-keepalive-time``)."""
    grpc_keepalive_timeout_ms: int = Field(default=20_000, gt=0)
    """How long a ping waits for its acknowledgement before the connection is closed
    (``--grpc-keepalive-timeout``)."""
    grpc_keepalive_permit_without_calls: bool = False
    """Allow keepalive pings while no call is in flight
    (``--grpc-keepalive-permit-without-calls``)."""
    grpc_http2_max_pings_without_data: int = Field(default=2, ge=0)
    """Pings sent while no data or header frame is sent; 0 means no limit
    (``--grpc-http2-max-pings-without-data``)."""
    grpc_http2_min_recv_ping_interval_without_data_ms: int = Field(default=300_000, ge=0)
    """Shortest interval between a client's pings while no data is sent; a shorter one is
    a ping strike (``--grpc-http2-min-recv-ping-interval-without-data``)."""
    grpc_http2_max_ping_strikes: int = Field(default=2, ge=0)
    """Ping strikes tolerated before the connection is closed with GOAWAY; 0 means any
    number (``--grpc-http2-max-ping-strikes``)."""
    grpc_max_connection_age_ms: int = Field(default=0, ge=0)
    """Longest life of a connection; 0 means unbounded (``--grpc-max-connection-age``)."""
    grpc_max_connection_age_grace_ms: int = Field(default=0, ge=0)
    """Grace given to calls on a connection past its age; 0 means gRPC's default
    (``--grpc-max-connection-age-grace``)."""

    grpc_use_ssl: bool = False
    """Serve gRPC over TLS only, with ``grpc_server_cert`` and ``grpc_server_key``
    (``--grpc-use-ssl``); a plaintext client is refused."""
    grpc_use_ssl_mutual: bool = False
    """Also require a client certificate that chains to ``grpc_root_cert``
    (``--grpc-use-ssl-mutual``); needs ``grpc_use_ssl``."""
    grpc_server_cert: Path | None = None
    """PEM file of the server's certificate chain, leaf first (``--grpc-server-cert``)."""
    grpc_server_key: Path | None = None
    """PEM file of the server's unencrypted private key (``--grpc-server-key``)."""
    grpc_root_cert: Path | None = None
    """PEM file of the certificates client certificates must chain to
    (``--grpc-root-cert``); read only with ``grpc_use_ssl_mutual``, as Triton does."""

    @model_validator(mode="after")
    def _check_tls(self) -> GrpcLimits:
        if self.grpc_use_ssl_mutual and not self.grpc_use_ssl:
            raise ValueError("grpc_use_ssl_mutual needs grpc_use_ssl")
        if self.grpc_use_ssl:
            missing = [
                name
                for name in ("grpc_server_cert", "grpc_server_key")
                if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(f"grpc_use_ssl needs {' and '.join(missing)} (PEM files)")
        if self.grpc_use_ssl_mutual and self.grpc_root_cert is None:
            raise ValueError(
                "grpc_use_ssl_mutual needs grpc_root_cert (PEM file of the certificates "
                "client certificates must chain to)"
            )
        return self

    @model_validator(mode="after")
    def _check_frontend(self) -> GrpcLimits:
        if self.grpc_frontend != "h2corn":
            return self
        unsupported = [
            name
            for name in AIO_ONLY_FIELDS
            if getattr(self, name) != type(self).model_fields[name].default
        ]
        if unsupported:
            raise ValueError(
                f"{', '.join(unsupported)} need grpc_frontend 'aio': the h2corn front end "
                "sends no keepalive pings, counts no ping strikes and ages no connections"
            )
        return self


AIO_ONLY_FIELDS: Final = (
    "grpc_keepalive_time_ms",
    "grpc_keepalive_timeout_ms",
    "grpc_keepalive_permit_without_calls",
    "grpc_http2_max_pings_without_data",
    "grpc_http2_min_recv_ping_interval_without_data_ms",
    "grpc_http2_max_ping_strikes",
    "grpc_max_connection_age_ms",
    "grpc_max_connection_age_grace_ms",
)
"""Settings only grpc.aio carries out; set to anything but their defaults, they refuse
the h2corn front end rather than be ignored by it."""


def channel_options(limits: GrpcLimits) -> list[tuple[str, int]]:
    """gRPC core's server channel arguments for ``limits`` (those Triton sets for its
    flags)."""
    options = [
        ("grpc.max_receive_message_length", limits.grpc_max_receive_bytes),
        ("grpc.max_send_message_length", limits.grpc_max_send_bytes),
        ("grpc.keepalive_time_ms", limits.grpc_keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", limits.grpc_keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(limits.grpc_keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", limits.grpc_http2_max_pings_without_data),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            limits.grpc_http2_min_recv_ping_interval_without_data_ms,
        ),
        ("grpc.http2.max_ping_strikes", limits.grpc_http2_max_ping_strikes),
        # gRPC sets SO_REUSEPORT by default, which would let a second server bind a port in
        # use and share its connections; a port must belong to one server, as in Triton.
        ("grpc.so_reuseport", 0),
    ]
    if limits.grpc_max_connection_age_ms != _UNSET:
        options.append(("grpc.max_connection_age_ms", limits.grpc_max_connection_age_ms))
    if limits.grpc_max_connection_age_grace_ms != _UNSET:
        options.append(
            ("grpc.max_connection_age_grace_ms", limits.grpc_max_connection_age_grace_ms)
        )
    return options
