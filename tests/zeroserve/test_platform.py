"""``zeroserve up`` composed in process: the admin and public servers come up on one loop,
answer, and are gone once the platform stops (every part on its exit stack). The process
behaviour (signals, workers left behind, exit status) is tested on real processes in
``tests/integration/test_platform_e2e.py``."""

from __future__ import annotations

import asyncio
import io
import re
import socket
from pathlib import Path

import httpx
import pytest

from activator.settings import ActivatorSettings
from control_plane.settings import ControlPlaneSettings
from foundation.serving import bind_socket
from zeroserve.platform import Platform, ensure_admin_token

pytestmark = pytest.mark.anyio

WAIT_S = 30.0


def _settings(tmp_path: Path, *, admin_port: int = 0) -> ControlPlaneSettings:
    settings, _ = ensure_admin_token(
        ControlPlaneSettings(
            admin_host="127.0.0.1",
            admin_port=admin_port,
            state_url="memory://",
            cache_dir=tmp_path / "cache",
            worker_log_dir=tmp_path / "workers",
        )
    )
    return settings


def _is_refused(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=WAIT_S).close()
    except ConnectionRefusedError:
        return True
    return False


async def test_the_platform_serves_until_stopped_then_stops_both_servers(tmp_path: Path) -> None:
    out = io.StringIO()
    platform = Platform(
        _settings(tmp_path),
        ActivatorSettings(host="127.0.0.1", port=0, state_url="memory://"),
        out=out,
    )
    stop = asyncio.Event()
    running = asyncio.create_task(platform.run(stop))
    try:
        async with asyncio.timeout(WAIT_S):
            while "admin API" not in out.getvalue():
                assert not running.done(), running
                await asyncio.sleep(0.02)
        public = re.search(r"serving models at (http://\S+)/v2/models", out.getvalue())
        admin = re.search(r"admin API (http://\S+)/admin/v1", out.getvalue())
        assert public is not None and admin is not None, out.getvalue()
        async with httpx.AsyncClient(timeout=WAIT_S) as client:
            assert (await client.get(f"{admin[1]}/healthz")).status_code == 200
            assert (await client.get(f"{public[1]}/v2/health/live")).status_code == 200
        assert not platform.lifecycle.is_stopping
    finally:
        stop.set()
        async with asyncio.timeout(WAIT_S):
            await running
    assert _is_refused(public[1])
    assert _is_refused(admin[1])


async def test_a_port_in_use_fails_before_anything_starts(tmp_path: Path) -> None:
    with bind_socket("127.0.0.1", 0) as taken:
        taken.listen()
        port = taken.getsockname()[1]
        platform = Platform(_settings(tmp_path, admin_port=port), None, out=io.StringIO())
        with pytest.raises(OSError):
            await platform.run(asyncio.Event())
