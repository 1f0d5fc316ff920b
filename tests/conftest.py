"""Fixtures shared by every test package."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# Data planes the tests start listen for gRPC only where a test asks (--grpc-port): left to
# Triton's default port, servers running at once (and other test sessions on the machine)
# would compete for 8001. Child processes inherit this.
os.environ.setdefault("ZEROSERVE_DATA_PLANE_GRPC_PORT", "0")
# The same for the metrics port (Triton's 8002): /metrics stays on the HTTP port.
os.environ.setdefault("ZEROSERVE_DATA_PLANE_METRICS_PORT", "0")

# `zeroserve up` stores its admin URL and token in the user's config folder: the platforms the
# tests start must not write into the real one (nor share one across test sessions).
_CONFIG_HOME = tempfile.mkdtemp(prefix="zeroserve-test-config-")
os.environ["XDG_CONFIG_HOME"] = _CONFIG_HOME
atexit.register(shutil.rmtree, _CONFIG_HOME, ignore_errors=True)

# `zeroserve up` keeps its state in the user's data folder by default: the platforms tests
# start keep theirs in a folder of this session instead (tests that start several at once
# give each its own), so no run reads or leaves registrations of another.
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="zeroserve-test-data-")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
