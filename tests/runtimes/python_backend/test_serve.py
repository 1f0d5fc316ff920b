"""Triton Python-backend models in a real ``zeroserve serve`` process: a client's timeout
while a model sleeps, a crash, memory over load/unload cycles and a leaking model.

Memory bound: 50 load/unload cycles of a Python model (its stub process started and ended
each time) grow the server's resident memory by less than 16 MiB after the first five
(measured: 100.9 MiB after 5 cycles, 101.8 MiB after 50), and a model that leaked 256 MiB
in its stub takes that memory with it when unloaded (the process ends).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import ServerProcess, start_server
from tests.runtimes.python_backend.triton_models import write_repository

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
GROWTH_BOUND_BYTES = 16 * MiB


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = write_repository(
        tmp_path_factory.mktemp("repo"), ["add_sub", "sleepy", "crash", "leaky", "strings"]
    )
    process = start_server(
        repo,
        tmp_path_factory.mktemp("logs"),
        "--grpc-port",
        "0",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "add_sub",
        "--load-model",
        "sleepy",
    )
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60.0) as c:
        yield c


ADD_SUB = {
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]},
    ]
}


def _one(value: float) -> dict[str, object]:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [value]}]}


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def test_a_client_timing_out_on_a_sleeping_model_leaves_the_server_serving(
    server: ServerProcess, client: httpx.Client
):
    with httpx.Client(base_url=server.url, timeout=1.0) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post("/v2/models/sleepy/infer", json=_one(3.0))
    assert client.post("/v2/models/add_sub/infer", json=ADD_SUB).status_code == 200
    # The sleeping instance finishes its execute; the model serves the next request.
    again = client.post("/v2/models/sleepy/infer", json=_one(0.0))
    assert again.status_code == 200
    assert again.json()["outputs"][0]["data"] == [0.0]
    assert client.get("/v2/health/ready").status_code == 200


def test_a_crash_takes_only_that_model_out(server: ServerProcess, client: httpx.Client):
    assert client.post("/v2/repository/models/crash/load").status_code == 200
    response = client.post("/v2/models/crash/infer", json=_one(1.0))
    assert response.status_code == 500
    assert response.json() == {"error": "Stub process 'crash_0_0' is not healthy."}
    assert server.process.poll() is None
    assert client.post("/v2/models/add_sub/infer", json=ADD_SUB).status_code == 200
    assert client.post("/v2/repository/models/crash/load").status_code == 200
    assert client.get("/v2/models/crash/ready").status_code == 200


def test_load_unload_cycles_keep_the_servers_memory_bounded(
    server: ServerProcess, client: httpx.Client
):
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}]}

    def cycle() -> None:
        assert client.post("/v2/repository/models/strings/load").status_code == 200
        assert client.post("/v2/models/strings/infer", json=body).status_code == 200
        assert client.post("/v2/repository/models/strings/unload").status_code == 200

    for _ in range(5):
        cycle()
    before = _rss_bytes(server.process.pid)
    stubs_before = len(_children(server.process.pid))
    for _ in range(45):
        cycle()
    growth = _rss_bytes(server.process.pid) - before
    assert growth < GROWTH_BOUND_BYTES, f"RSS grew {growth / MiB:.1f} MiB over 45 cycles"
    assert len(_children(server.process.pid)) == stubs_before


def test_a_leaking_models_memory_is_returned_at_unload(server: ServerProcess, client: httpx.Client):
    pid = server.process.pid
    before = set(_children(pid))
    assert client.post("/v2/repository/models/leaky/load").status_code == 200
    (stub,) = set(_children(pid)) - before
    for _ in range(4):
        assert client.post("/v2/models/leaky/infer", json=_one(1.0)).status_code == 200
    assert _rss_bytes(stub) > 256 * MiB
    server_rss = _rss_bytes(pid)
    assert client.post("/v2/repository/models/leaky/unload").status_code == 200
    assert stub not in _children(pid)
    assert not Path(f"/proc/{stub}").exists()
    assert _rss_bytes(pid) < server_rss + GROWTH_BOUND_BYTES


def test_stubs_end_when_the_server_is_killed(tmp_path: Path):
    repo = write_repository(tmp_path / "repo", ["add_sub"])
    process = start_server(
        repo, tmp_path, "--grpc-port", "0", "--model-control-mode", "explicit",
        "--load-model", "add_sub",
    )  # fmt: skip
    try:
        stubs = _children(process.process.pid)
        assert len(stubs) == 1
        process.process.kill()
        process.process.wait(timeout=30)
        # The stub notices its parent is gone (it is reparented) and exits; bounded wait.
        deadline = time.monotonic() + 30
        while Path(f"/proc/{stubs[0]}").exists() and _state(stubs[0]) != "Z":
            assert time.monotonic() < deadline, "the stub outlived its server"
            time.sleep(0.1)
    finally:
        process.stop()


def _state(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split() or ["?"])[0]
    except OSError:
        return "gone"
