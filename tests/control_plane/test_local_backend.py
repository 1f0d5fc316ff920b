"""The local backend's own promises: no worker process survives, however the parent goes.

Start, probe, stop, the pool bound, losing a killed worker and loading a model through the
placer are in ``test_backend_contract.py``, which runs them against every backend."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from control_plane.backends.base import PoolSpec
from control_plane.backends.local import LocalBackend
from tests.control_plane.fakes import make_settings

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

GONE_TIMEOUT_S = 30.0
ROOT = Path(__file__).resolve().parents[2]


def is_alive(pid: int) -> bool:
    """Running, not a zombie (a container's init may not reap reparented children)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        await asyncio.sleep(0.1)
    return False


class Lost:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.event = asyncio.Event()

    async def __call__(self, worker_id: str) -> None:
        self.ids.append(worker_id)
        self.event.set()


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[tuple[LocalBackend, Lost]]:
    settings = make_settings(
        tmp_path / "cache",
        worker_log_dir=tmp_path / "logs",
        worker_health_interval_s=0.5,
        worker_stop_timeout_s=10.0,
    )
    lost = Lost()
    local = LocalBackend(settings, on_worker_lost=lost, repository=tmp_path / "repository")
    await local.ensure_pool(PoolSpec(name="default", max_workers=2))
    try:
        yield local, lost
    finally:
        await local.close()


async def test_close_leaves_no_process(backend: tuple[LocalBackend, Lost]):
    local, _ = backend
    workers = await asyncio.gather(local.start_worker("default"), local.start_worker("default"))
    pids = [local.details(w.id)["pid"] for w in workers]
    await local.close()
    for pid in pids:
        assert isinstance(pid, int)
        assert await wait_gone(pid)


PARENT = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from control_plane.backends.base import PoolSpec
    from control_plane.backends.local import LocalBackend
    from tests.control_plane.fakes import make_settings

    async def main():
        root = Path(sys.argv[1])
        async def lost(worker_id):
            pass
        backend = LocalBackend(
            make_settings(root / "cache"), on_worker_lost=lost, repository=root / "repo"
        )
        await backend.ensure_pool(PoolSpec(name="default", max_workers=1))
        worker = await backend.start_worker("default")
        print(backend.details(worker.id)["pid"], flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


async def test_workers_die_with_a_killed_parent(tmp_path: Path):
    """SIGKILL gives the parent no chance to stop its workers: the kernel must."""
    parent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PARENT,
        str(tmp_path),
        stdout=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert parent.stdout is not None
        line = await asyncio.wait_for(parent.stdout.readline(), 120)
        worker_pid = int(line)
        assert is_alive(worker_pid)
        parent.kill()
        await asyncio.wait_for(parent.wait(), 30)
        assert await wait_gone(worker_pid)
    finally:
        if parent.returncode is None:
            parent.kill()
            await parent.wait()
