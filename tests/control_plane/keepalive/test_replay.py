"""The simulator: a tiny trace with a hand-computed answer, and the ServeGen sample."""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import yaml

from control_plane.keepalive import AlwaysOnPolicy, FixedPolicy
from control_plane.keepalive.replay import ORACLE, replay
from control_plane.keepalive.traces import read_plain_csv, read_servegen, servegen_files
from zeroserve.cli import main

SAMPLE = Path(__file__).parents[2] / "data" / "servegen"
LOAD = 20.0


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    # Busy [0, 5], [100, 105] and [1000, 1005]: idle gaps of 95 s and 895 s.
    path = tmp_path / "access.csv"
    path.write_text("timestamp,model\n0,a\n100,a\n1000,a\n", encoding="utf-8")
    return path


def test_tiny_trace_by_hand(tiny: Path):
    traces = read_plain_csv(tiny, hold_s=5.0)
    results = {
        r.policy: r
        for r in replay(
            traces,
            [AlwaysOnPolicy(), FixedPolicy(60.0), FixedPolicy(600.0)],
            load_s=LOAD,
            bound_s=3600.0,
        )
    }
    # always-on: loaded from the start, idle through both gaps.
    on = results["always-on"]
    assert (on.cold_starts, on.idle_s, on.loading_s) == (0, 990.0, 0.0)
    assert on.serving_s + on.idle_s == on.always_on_s == 1005.0
    # 60 s: the first request and both gaps are cold; 60 s idle before each unload.
    short = results["fixed 1 min"]
    assert (short.cold_starts, short.idle_s, short.loading_s) == (3, 120.0, 60.0)
    assert short.cold_start_rate == 1.0
    assert short.latency_percentile(50) == LOAD
    # 10 min: the 95 s gap is kept through, the 895 s one is not.
    long = results["fixed 10 min"]
    assert (long.cold_starts, long.idle_s, long.loading_s) == (2, 95.0 + 600.0, 40.0)
    assert long.activations == 2
    # The oracle loads just in time, three times.
    oracle = results[ORACLE]
    assert (oracle.cold_starts, oracle.idle_s, oracle.loading_s) == (0, 0.0, 60.0)


def test_servegen_sample_replays_every_request_deterministically():
    files = servegen_files(SAMPLE)
    assert [f.name for f in files] == ["chunk-1-trace.csv", "chunk-50-trace.csv"]
    expected = 0
    for f in files:
        rows = np.genfromtxt(f, delimiter=",", usecols=(1,))
        expected += int(np.rint(rows * 600).sum())
    first = read_servegen(files, hold_s=5.0, seed=7)
    again = read_servegen(files, hold_s=5.0, seed=7)
    assert sum(t.requests for t in first) == expected
    for a, b in zip(first, again, strict=True):
        assert np.array_equal(a.start, b.start)
        assert np.all(np.diff(a.start) > 0)
        assert np.all(a.start[1:] - (a.last[:-1] + a.hold_s) > 0)  # idle gaps between
        assert a.horizon_s == 14 * 86400.0


def test_simulate_command_prints_every_policy_and_plots(tmp_path: Path):
    plot = tmp_path / "curves.png"
    out = io.StringIO()
    with redirect_stdout(out):
        status = main(["simulate", str(SAMPLE), "--plot", str(plot), "-o", "json"])
    assert status == 0
    doc = json.loads(out.getvalue())
    rows = {p["policy"]: p for p in doc["policies"]}
    assert {"always-on", "knative 60 s", "fixed 20 min", "histogram (ATC'20)", ORACLE} <= set(rows)
    assert any(name.startswith("adaptive") for name in rows)
    assert rows[ORACLE]["cold_starts"] == 0
    assert rows["always-on"]["wasted_share"] >= max(p["wasted_share"] for p in rows.values())
    assert plot.stat().st_size > 0
    assert not math.isnan(rows["knative 60 s"]["added_latency_p999_s"])


def test_simulate_prints_yaml_as_it_prints_json():
    printed = {}
    for fmt in ("json", "yaml"):
        out = io.StringIO()
        with redirect_stdout(out):
            assert main(["simulate", str(SAMPLE), "-o", fmt]) == 0
        printed[fmt] = (
            json.loads(out.getvalue()) if fmt == "json" else yaml.safe_load(out.getvalue())
        )
    for doc in printed.values():
        doc.pop("cpu_s"), doc.pop("wall_s")
    assert printed["yaml"] == printed["json"]
