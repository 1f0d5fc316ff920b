"""``bench/compare.py --quick`` (what CI runs of it): engine alone and zeroserve, end to end.

The peers are left out of the quick run, visibly: installing MLServer and KServe into their
environments takes about two minutes on the 2-core machine, more than CI's test budget, and
real Triton (a wheel download on a fresh machine, then seconds of start-up per run) and
zeroserve's Python-model form go with them; the full run (``python bench/compare.py``)
installs and measures them. Triton as a peer is checked here on its own, where it can run:
started as the comparison starts it, answering the engine's output over JSON, binary
tensors and gRPC. Only what the run reports
is checked, never how fast anything was. It runs once per load generator: wrk (what a full
run uses where wrk is installed; skipped visibly where it is not) and ``zeroserve bench``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.comparison import measure, results
from bench.comparison.grpc_probe import GrpcProbe
from bench.comparison.python_models import TritonPeer
from bench.engine import Engine
from bench.loadgen import Target, WrkLoad
from bench.models import MODELS, request_body, sample_rows, write_model
from bench.server import free_port, infer_once
from tests.triton_oracle import require_triton

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("client", ["wrk", "zeroserve-bench"])
def test_quick_compare_writes_results_and_plot(tmp_path, client):
    if client == "wrk" and shutil.which("wrk") is None:
        pytest.skip("wrk not installed (apt-get install -y wrk)")
    results = tmp_path / "results"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "compare.py"),
            "--quick",
            "--no-activator",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--results-dir",
            str(results),
            "--tag",
            "ci",
            "--client",
            client,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "MLServer and KServe are skipped" in done.stderr
    assert "so is real Triton" in done.stderr
    assert ("Load: wrk" if client == "wrk" else "Load: zeroserve bench") in done.stdout
    [document_path] = results.glob("*-ci-compare-quick.json")
    assert document_path.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    document = json.loads(document_path.read_text())
    assert document["client"] == client
    servers = {(p["server"], p["batch_size"], p["concurrency"]) for p in document["points"]}
    assert servers == {
        ("engine", 1, None),
        ("engine", 32, None),
        ("zeroserve", 1, 1),
        ("zeroserve", 1, 64),
    }
    for point in document["points"]:
        assert point["median"]["throughput"] > 0
        if point["server"] == "zeroserve":
            assert all(r["error_count"] == 0 for r in point["repeats"])
    ratio = document["summary"]["servers"]["zeroserve"]["64"]["ratio_to_engine_b32"]
    assert ratio > 0
    cold = document["cold_load"]
    assert set(cold) == {"engine", "zeroserve"}
    assert all(not r.get("failed") and r["load_s"] > 0 for runs in cold.values() for r in runs)
    assert document["caveat"]
    replot = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compare.py"), "--replot", str(document_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert replot.returncode == 0, replot.stderr[-3000:]
    assert "zeroserve" in replot.stdout and "Load: " in replot.stdout


def test_a_server_that_refuses_connections_is_a_failed_point(tmp_path):
    if shutil.which("wrk") is None:
        pytest.skip("wrk not installed (apt-get install -y wrk)")
    spec = MODELS["light"]
    point = measure.wrk_point(
        WrkLoad(tmp_path, timeout_s=2),
        Target("127.0.0.1", free_port(), f"/v2/models/{spec.name}/infer"),
        request_body(spec, sample_rows(spec, 1), "json"),
        2,
        measure.LoadSettings(duration_s=1, warmup_s=0),
        os.getpid(),
    )
    assert point["throughput"] == 0.0
    assert "Connection refused" in point["failed"]
    assert point["command"][0] == "wrk"


def test_triton_peer_answers_the_engine_over_each_protocol(tmp_path):
    install = require_triton()
    spec = MODELS["light"]
    model_path = tmp_path / "light.onnx"
    write_model(spec, model_path)
    row = sample_rows(spec, 1)
    expected = Engine(model_path).run(row)
    peer = TritonPeer(tmp_path, install, {spec.name: (spec, model_path)}, [spec.name])
    try:
        peer.start()
        process = peer.server.process
        assert peer.grpc_address is not None
        port = int(peer.url.rsplit(":", 1)[1])
        for encoding in ("json", "binary"):
            served = infer_once(port, spec.name, request_body(spec, row, encoding))
            np.testing.assert_allclose(served, expected, rtol=1e-4, atol=1e-5)
        probe = GrpcProbe(peer.grpc_address, spec.name, row, tmp_path / "body.grpc")
        try:
            before = probe.successes()
            np.testing.assert_allclose(probe.infer(), expected, rtol=1e-4, atol=1e-5)
            assert probe.successes() == before + 1
        finally:
            probe.close()
        peer.unload(spec.name)
        peer.load(spec.name)
    finally:
        peer.stop()
    assert process.poll() is not None


def test_native_onnx_ratios_compare_like_protocols():
    def entry(key: str, size: int, throughput: float, cpu_ms: float) -> results.Entry:
        record = {"throughput": throughput, "server_cpu_ms_per_request": cpu_ms}
        return results.Entry(key, key, size, [record])

    entries = [
        entry("zeroserve", 1, 2000.0, 0.4),
        entry("zeroserve-python", 1, 1000.0, 0.5),
        entry("triton", 1, 4000.0, 0.8),
        entry("zeroserve-grpc", 1, 900.0, 0.7),
        entry("triton-grpc", 1, 1800.0, 1.0),
        entry("zeroserve-binary", 1, 500.0, 0.3),
    ]
    table = results.native_onnx(entries, [1])
    assert table == {
        "json": {
            "1": {
                "onnx": 2000.0,
                "onnx_cpu_ms": 0.4,
                "python_model": 1000.0,
                "ratio_to_python_model": 2.0,
                "python_model_cpu_ms": 0.5,
                "triton": 4000.0,
                "ratio_to_triton": 0.5,
                "triton_cpu_ms": 0.8,
            }
        },
        "grpc": {
            "1": {
                "onnx": 900.0,
                "onnx_cpu_ms": 0.7,
                "triton": 1800.0,
                "ratio_to_triton": 0.5,
                "triton_cpu_ms": 1.0,
            }
        },
    }
    assert results.native_onnx_lines(table)[1] == (
        "grpc   c=1   ONNX runtime      900/s (0.700 ms CPU/req); "
        "0.50x Triton (1,800/s, 1.000 ms CPU/req)"
    )
