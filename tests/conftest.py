"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import tempfile

import pytest

# Data planes the tests start listen for gRPC only where a test asks (--grpc-port): left to
# Triton's default port, servers running at once (and other test sessions on the machine)
# would compete for 8001. Child processes inherit this.
os.environ.setdefault("ZEROSERVE_DATA_PLANE_GRPC_PORT", "0")

# `zeroserve up` keeps its state in the user's data folder by default: the platforms tests
# start keep theirs in a folder of this session instead (tests that start several at once
# give each its own), so no run reads or leaves registrations of another.
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="zeroserve-test-data-")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
