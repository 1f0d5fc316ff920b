"""``zeroserve bench --protocol grpc`` and ``--shared-memory system`` against a real
``zeroserve serve`` on loopback (HTTP and gRPC on free ports).

Each run lasts a fraction of a second per level; what is checked is what the command
reports and what it leaves on the server (no region registered, no object in /dev/shm),
never how fast. A separate group checks, in process, that the requests the shared-memory
runs send really make the server read the inputs from and write the outputs into the
run's regions.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.models import write_onnx_identity, write_onnx_mlp
from tests.triton_oracle import free_ports
from tests.zeroserve.bench.serve import Served, zeroserve_serve
from zeroserve.bench.args import BenchConfig
from zeroserve.bench.grpc_setup import prepare_grpc
from zeroserve.bench.http_setup import prepare_http
from zeroserve.bench.shared_memory import SHM_ROOT

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 120.0
BAD_ENDPOINT_TIMEOUT_S = 60.0
"""A run against a bad endpoint must end (with its reason) well within this."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("bench-grpc-serve")
    repo = root / "models"
    write_onnx_mlp(repo, "mlp", sizes=(16, 32, 8), max_batch_size=32)
    write_onnx_identity(repo, "identity", datatype="FP32", dims=(-1,), max_batch_size=8)
    with zeroserve_serve(repo, root) as server:
        yield server


def _bench(*argv: str, timeout_s: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "zeroserve.cli", "bench", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)


def _bench_objects() -> set[str]:
    return {path.name for path in SHM_ROOT.glob("zsbench_*")}


def _registered(served: Served) -> list[dict[str, Any]]:
    status = httpx.get(f"{served.url}/v2/systemsharedmemory/status", timeout=10.0)
    assert status.status_code == 200, status.text
    regions: list[dict[str, Any]] = status.json()
    return regions


def _successes(served: Served, model: str) -> int:
    answer = httpx.get(f"{served.url}/v2/models/{model}/stats", timeout=10.0)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["model_stats"][0]["inference_stats"]["success"]["count"])


def test_grpc_closed_loop(served, tmp_path):
    out = tmp_path / "out.json"
    before = _successes(served, "mlp")
    done = _bench(
        served.grpc_address, "--protocol", "grpc", "--model", "mlp", "--concurrency", "1,4",
        "--streams-per-connection", "2", "--duration", "0.5s", "--warmup", "0.2s",
        "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "gRPC ModelInfer" in done.stdout and "c=4" in done.stdout
    document = json.loads(out.read_text())
    assert document["target"]["transport"] == "grpc"
    assert document["target"]["path"] == "/inference.GRPCInferenceService/ModelInfer"
    assert document["target"]["encoding"] == "raw"
    assert document["load"]["streams_per_connection"] == 2
    levels = document["levels"]
    # Four calls at once, at most two per connection: two connections.
    assert [level["connections"] for level in levels] == [1, 2]
    for level in levels:
        assert level["ok"] > 0 and level["errors"] == {}
        assert level["latency"]["count"] == level["ok"]
    # The server counted at least every answer the bench counted (warm-up ones come on top).
    assert _successes(served, "mlp") - before >= sum(level["ok"] for level in levels)


def test_grpc_open_loop(served, tmp_path):
    out = tmp_path / "out.json"
    done = _bench(
        served.grpc_address, "--protocol", "grpc", "--model", "mlp", "--request-rate", "40",
        "--duration", "0.5s", "--warmup", "0.1s", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [level] = json.loads(out.read_text())["levels"]
    assert level["mode"] == "rate" and level["ok"] > 0 and level["errors"] == {}
    assert "offered/s" in done.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("mode", ["--concurrency", "--request-rate"])
def test_shared_memory_runs_and_cleans_up(served, tmp_path, protocol, mode):
    address = served.grpc_address if protocol == "grpc" else served.url
    level = "1,3" if mode == "--concurrency" else "40"
    out = tmp_path / "out.json"
    objects = _bench_objects()
    done = _bench(
        address, "--protocol", protocol, "--shared-memory", "system", "--model", "mlp",
        mode, level, "--max-connections", "8", "--duration", "0.4s", "--warmup", "0.1s",
        "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    assert document["target"]["shared_memory"] == "system"
    assert document["target"]["encoding"] == "shared_memory"
    for result in document["levels"]:
        assert result["ok"] > 0 and result["errors"] == {}
    assert _registered(served) == []
    assert _bench_objects() == objects


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_regions_are_released_when_the_run_fails(served, protocol):
    """Outputs of variable size get ``--output-shared-memory-size`` bytes: 4 cannot hold the
    identity model's 64 floats, so the check request fails after the regions are registered;
    the run must still unregister and remove them."""
    address = served.grpc_address if protocol == "grpc" else served.url
    objects = _bench_objects()
    done = _bench(
        address, "--protocol", protocol, "--shared-memory", "system", "--model", "identity",
        "--shape", "INPUT0:64", "--output-shared-memory-size", "4", "--duration", "0.2s",
    )  # fmt: skip
    assert done.returncode == 2
    assert "the check" in done.stderr and "OUTPUT0" in done.stderr, done.stderr
    assert _registered(served) == []
    assert _bench_objects() == objects


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_server_reads_and_writes_the_regions(served, protocol):
    """The check request of a shared-memory run makes the server read the run's input and
    write the answer into the first slot's window: the identity model's output there is the
    input."""
    address = served.grpc_address if protocol == "grpc" else served.url
    config = BenchConfig(
        url=address,
        model="identity",
        protocol="grpc" if protocol == "grpc" else "http",
        shared_memory="system",
        shapes=(("INPUT0", (64,)),),
        levels=(2.0,),
    )
    prepared = prepare_grpc(config) if protocol == "grpc" else prepare_http(config)
    try:
        shm = prepared.shared_memory
        assert shm is not None
        assert shm.input_object is not None and shm.output_object is not None
        assert {r["name"] for r in _registered(served)} == {shm.input_region, shm.output_region}
        [placed] = shm.layout.inputs[0]
        [slot0, slot1] = [outputs[0].place for outputs in shm.layout.outputs]
        assert slot1.offset >= slot0.offset + slot0.byte_size
        sent = shm.input_object.read(placed.place.offset, placed.place.byte_size)
        written = shm.output_object.read(slot0.offset, placed.place.byte_size)
        assert written == sent and np.frombuffer(sent, dtype=np.float32).any()
    finally:
        prepared.close()
    assert _registered(served) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(("--protocol", "grpc"), "cannot reach a gRPC server", id="grpc, nobody"),
        pytest.param((), "cannot reach", id="http, nobody"),
    ],
)
def test_nobody_listening(argv, message):
    (port,) = free_ports(1)
    started = time.monotonic()
    done = _bench(
        f"127.0.0.1:{port}", "--model", "m", *argv, "--duration", "0.2s",
        timeout_s=BAD_ENDPOINT_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert time.monotonic() - started < BAD_ENDPOINT_TIMEOUT_S


def test_wrong_ports_and_bad_requests_say_why(served):
    cases = [
        # gRPC to the HTTP port, HTTP to the gRPC port.
        ((served.url.removeprefix("http://"), "--protocol", "grpc"), "cannot reach a gRPC"),
        ((f"http://{served.grpc_address}",), "HTTP/2, not HTTP/1.1"),
        ((served.grpc_address, "--protocol", "grpc", "--model", "nope"), "NOT_FOUND"),
        ((served.url, "--protocol", "grpc"), "not 'http://"),
        ((served.grpc_address, "--protocol", "grpc", "--binary"), "--binary"),
        (
            (served.grpc_address, "--protocol", "grpc", "--shape", "INPUT0:3"),
            "the check call to ModelInfer",
        ),
    ]
    for argv, message in cases:
        if "--model" not in argv:
            argv = (*argv, "--model", "mlp")
        done = _bench(*argv, "--duration", "0.2s", timeout_s=BAD_ENDPOINT_TIMEOUT_S)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert message in done.stderr, (argv, done.stderr)
