"""``bench/compare.py --quick`` (what CI runs of it): engine alone and zeroserve, end to end.

The peers are left out of the quick run, visibly: installing MLServer and KServe into their
environments takes about two minutes on the 2-core machine, more than CI's test budget; the
full run (``python bench/compare.py``) installs and measures them. Only what the run reports
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

import pytest

from bench.comparison import measure
from bench.loadgen import Target, WrkLoad
from bench.models import MODELS, request_body, sample_rows
from bench.server import free_port

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
