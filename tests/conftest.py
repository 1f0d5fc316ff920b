"""Fixtures shared by every test package."""

from __future__ import annotations

import os

import pytest

# Data planes the tests start listen for gRPC only where a test asks (--grpc-port): left to
# Triton's default port, servers running at once (and other test sessions on the machine)
# would compete for 8001. Child processes inherit this.
os.environ.setdefault("ZEROSERVE_DATA_PLANE_GRPC_PORT", "0")
# The same for the metrics port (Triton's 8002): /metrics stays on the HTTP port.
os.environ.setdefault("ZEROSERVE_DATA_PLANE_METRICS_PORT", "0")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
