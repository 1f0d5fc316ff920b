"""The h2corn HTTP/2 server carrying a `GrpcApp`, embedded on the caller's event loop.

h2corn (Rust: HTTP/2 framing, HPACK, flow control and the socket I/O off the event loop)
hands each call to the app as an ASGI request whose response may end with trailers. Its
HTTP/2 bounds are set here from `GrpcLimits`, with the values the attack tests
(tests/foundation/grpc_front/test_attacks.py) hold it to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from typing import Final

import h2corn

from foundation.grpc_front.app import GrpcApp
from foundation.grpc_limits import GrpcLimits
from foundation.grpc_tls import ServerTls
from foundation.serving import ServerStartError

__all__ = ["h2corn_config", "serve_grpc_front"]

logger = logging.getLogger(__name__)

_MAX_HEADER_LIST_BYTES: Final = 16 * 1024
"""Decoded and compressed metadata of one call: gRPC core's own hard limit (16 KiB), so a
client whose headers pass grpc.aio passes here, and an HPACK bomb stops at 16 KiB."""
_START_TIMEOUT_S: Final = 30.0
_BACKLOG: Final = 1024


def h2corn_config(
    limits: GrpcLimits, *, fd: int, drain_timeout_s: float, tls: ServerTls | None = None
) -> h2corn.Config:
    """h2corn's configuration serving gRPC (HTTP/2 only: prior knowledge in plaintext,
    ALPN ``h2`` over TLS) on the bound listening socket ``fd`` under ``limits``, over
    ``tls`` when given."""
    return h2corn.Config(
        bind=(f"fd://{fd}",),
        grpc=True,
        http1=False,
        lifespan="off",
        access_log=False,
        runtime_threads=limits.grpc_h2corn_threads,
        max_concurrent_streams=limits.grpc_http2_max_concurrent_streams,
        h2_max_header_list_size=_MAX_HEADER_LIST_BYTES,
        h2_max_header_block_size=_MAX_HEADER_LIST_BYTES,
        limit_request_fields=100,
        # grpc.aio keeps an idle connection open (clients hold channels for hours).
        timeout_keep_alive=0,
        timeout_graceful_shutdown=drain_timeout_s,
        certfile=None if tls is None else tls.cert_path,
        keyfile=None if tls is None else tls.key_path,
        ca_certs=None if tls is None else tls.root_path,
        cert_reqs="required" if tls is not None and tls.requires_client_cert else "none",
    )


@contextlib.asynccontextmanager
async def serve_grpc_front(
    app: GrpcApp,
    sock: socket.socket,
    limits: GrpcLimits,
    *,
    drain_timeout_s: float,
    tls: ServerTls | None = None,
) -> AsyncIterator[int]:
    """Serve ``app`` on the bound socket ``sock`` while inside, over ``tls`` when given;
    yields the port. On exit the server stops accepting and gives calls in flight
    ``drain_timeout_s`` before cancelling them. ``sock`` is the caller's: h2corn serves a
    duplicate of it. A start h2corn refuses (a certificate its TLS library rejects, say)
    raises ServerStartError."""
    sock.listen(_BACKLOG)  # a bound socket is enough to pass; h2corn accepts on it as it is
    config = h2corn_config(limits, fd=sock.fileno(), drain_timeout_s=drain_timeout_s, tls=tls)
    server = h2corn.Server(app, config)
    serving = asyncio.create_task(server.serve(), name="grpc-front")
    try:
        async with asyncio.timeout(_START_TIMEOUT_S):
            await server.wait_started()
    except BaseException as exc:
        serving.cancel()
        with contextlib.suppress(BaseException):
            await serving
        if isinstance(exc, OSError | ValueError):
            raise ServerStartError(server="gRPC", reason=f"h2corn: {exc}") from None
        raise
    port: int = sock.getsockname()[1]
    try:
        yield port
    finally:
        server.shutdown()
        await serving
