"""``bench/grpc_transports.py --quick`` end to end (zeroserve serve, real Triton where it installs,
h2load where installed), and its fallback client; plus the h2load helpers it relies on.
Only that the runs finish, check their answers and report without errors is asserted,
never how fast anything was."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import h2load

ROOT = Path(__file__).resolve().parents[2]


def _run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=cwd)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert "answers checked against ONNX Runtime" in output, output[-4000:]
    return output


@pytest.mark.integration
def test_quick_run_as_a_script(tmp_path: Path) -> None:
    """Run by path: bench/ first on sys.path must not let this file shadow grpcio."""
    output = _run(
        [sys.executable, str(ROOT / "bench" / "grpc_transports.py"), "--quick", "--no-save"],
        tmp_path,
    )
    assert "| c | HTTP/1.1 binary | gRPC | gRPC + system shared memory |" in output
    assert "target: zeroserve gRPC, model.py in Triton's contract >= Triton" in output
    points = [line for line in output.splitlines() if line.startswith("repeat 0 ")]
    assert points and all(" errors 0 " in line for line in points), output[-4000:]


@pytest.mark.integration
def test_quick_run_with_zeroserve_bench_as_the_client(tmp_path: Path) -> None:
    output = _run(
        [
            sys.executable,
            "-m",
            "bench.grpc_transports",
            "--quick",
            "--no-save",
            "--no-triton",
            "--client",
            "zeroserve-bench",
            "--concurrency",
            "1",
            "2",
        ],  # fmt: skip
        ROOT,
    )
    assert "load generator: zeroserve bench" in output
    points = [line for line in output.splitlines() if line.startswith("repeat 0 ")]
    assert len(points) == 2 * 6 and all(" errors 0 " in line for line in points), output


def test_connections_and_streams_make_the_concurrency() -> None:
    assert h2load.layout(1, 8) == (1, 1)
    assert h2load.layout(8, 8) == (1, 8)
    assert h2load.layout(64, 8) == (8, 8)
    with pytest.raises(ValueError, match="not a multiple"):
        h2load.layout(12, 8)


def _summary(done: int, failed: int, errored: int, timeouts: int, statuses: str) -> str:
    return (
        f"finished in 2.00s, 1174.00 req/s, 1.00MB/s\n"
        f"requests: {done} total, {done} started, {done} done, {done - failed} succeeded, "
        f"{failed} failed, {errored} errored, {timeouts} timeout\n"
        f"status codes: {statuses}\n"
    )


@pytest.mark.parametrize(
    ("output", "errors"),
    [
        # Read from h2load 1.52 --h1 at c=1 against zeroserve: a 2xx count one short of or
        # one over ``done`` at the warm-up's edge, every answer a 200.
        (_summary(2348, 0, 0, 0, "2347 2xx, 0 3xx, 0 4xx, 0 5xx"), 0),
        (_summary(2629, 0, 0, 0, "2630 2xx, 0 3xx, 0 4xx, 0 5xx"), 0),
        (_summary(100, 0, 0, 0, "97 2xx, 0 3xx, 1 4xx, 2 5xx"), 3),
        (_summary(100, 2, 1, 1, "96 2xx, 0 3xx, 0 4xx, 0 5xx"), 4),
    ],
)
def test_errors_are_what_h2load_read_go_wrong(output: str, errors: int) -> None:
    assert h2load.errors_in(output) == errors


def test_errors_need_h2loads_summary() -> None:
    with pytest.raises(ValueError, match="no request or status summary"):
        h2load.errors_in("finished in 2.00s, 1174.00 req/s, 1.00MB/s\n")


@pytest.mark.integration
@pytest.mark.skipif(h2load.find() is None, reason="needs h2load (apt-get install nghttp2-client)")
def test_front_ends_quick_run(tmp_path: Path) -> None:
    """``bench/grpc_frontends.py``: both zeroserve front ends and both echo floors answer,
    checked, and reported without errors."""
    output = _run(
        [
            sys.executable,
            "-m",
            "bench.grpc_frontends",
            "--quick",
            "--no-save",
            "--no-triton",
            "--concurrency",
            "1",
        ],  # fmt: skip
        ROOT,
    )
    points = [line for line in output.splitlines() if line.startswith("repeat 0 ")]
    assert len(points) == 6 and all(" errors 0 " in line for line in points), output
    assert "| zeroserve ONNX, h2corn |" in output
