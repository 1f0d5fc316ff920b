"""Keep-alive policies on two weeks of production traffic (issue 26's benchmark).

Replays ServeGen's ``language/m-mid`` traces (109 clients, 14 days; each client one model
endpoint) through ``zeroserve simulate``'s replay with load times of 20 s and 60 s (two
runs), each request holding a replica 5 s, every model's ``idle_timeout_s`` (the bound of
the learned plans) 4 hours, and checks the targets:

1. from 0.5 % to 5 % cold starts the adaptive curve lies below the fixed one: every fixed
   keep-alive in that range is dominated by an adaptive point (no more cold starts, less
   GPU time);
2. at <= 1 % cold starts the adaptive policy holds at most 60 % of the GPU-seconds of the
   cheapest fixed keep-alive that reaches 1 %;
3. it beats the published histogram policy (an adaptive point with no more cold starts and
   less GPU time).

Cold starts are each model's share of its requests that waited for a load, averaged over
models; GPU-seconds are serving + idle + loading (target 2 also reports idle + loading
alone). No parameter is tuned to this trace: the policies run with their defaults.

    python bench/keepalive.py [--data PATH] [--tag vm] [--no-save] [--quick]

``--quick`` replays the two-client sample the tests vendor (``tests/data/servegen``): it
checks that the script works, its numbers mean nothing. ``--sensitivity`` instead replays
the 20-s run with the adaptive policy's parameters changed one at a time (half-life 12 h and
3 days, 5 and 20 idle times before the history is trusted, fallback 5 and 20 min), to show
that its results do not hinge on them; it writes ``<UTC time>-<tag>-keepalive-sensitivity.json``.

Writes ``bench/results/<UTC time>-<tag>-keepalive.json`` and one plot per load time.
"""

from __future__ import annotations

import argparse
import datetime
import math
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

# Run as a script, sys.path[0] is bench/; the repository root must come first so that
# `bench` is a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import machine, report
from control_plane.keepalive.policies import AdaptivePolicy
from control_plane.keepalive.replay import ORACLE, PolicyResult, replay
from control_plane.keepalive.traces import read_servegen, servegen_files
from zeroserve.simulate import default_policies, families, plot, table

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
DEFAULT_DATA: Final = Path("/work/shared/data/servegen/language/m-mid")
LOAD_TIMES_S: Final = (20.0, 60.0)
HOLD_S: Final = 5.0
BOUND_S: Final = 4 * 3600.0
DEFAULT_ADAPTIVE: Final = "adaptive 1.00%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="ServeGen m-mid folder")
    parser.add_argument("--tag", default=socket.gethostname(), help="machine tag in file names")
    parser.add_argument("--no-save", action="store_true", help="print only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="the 2-client sample only")
    parser.add_argument(
        "--sensitivity", action="store_true", help="vary the adaptive policy's parameters"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.data = REPO_ROOT / "tests" / "data" / "servegen"
    files = servegen_files(args.data)
    if not files:
        print(f"bench/keepalive.py: no ServeGen traces under {args.data}", file=sys.stderr)
        return 2
    started = datetime.datetime.now(datetime.UTC)
    stamp = started.strftime("%Y-%m-%dT%H%M%SZ")
    if args.sensitivity:
        return sensitivity(args, files, stamp, argv)
    runs: list[dict[str, Any]] = []
    all_passed = True
    for load_s in LOAD_TIMES_S:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        traces = read_servegen(files, hold_s=HOLD_S, seed=args.seed)
        policies = default_policies()
        results = replay(
            traces, policies, load_s=load_s, bound_s=BOUND_S, families=families(policies)
        )
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
        targets = evaluate(results)
        all_passed &= all(t["passed"] for t in targets)
        print(f"\n## load time {load_s:g} s, hold {HOLD_S:g} s, bound {BOUND_S:g} s\n")
        print(table(results))
        print(f"\nreplayed {len(files)} clients in {wall_s:.1f} s wall, {cpu_s:.1f} s CPU")
        for t in targets:
            print(f"  [{'PASS' if t['passed'] else 'FAIL'}] {t['target']}: {t['detail']}")
        print(f"  oracle distance: {oracle_distance(results)}")
        png = RESULTS_DIR / f"{stamp}-{args.tag}-keepalive-{load_s:g}s.png"
        if not args.no_save:
            plot(results, png, title=f"m-mid, load {load_s:g} s, hold {HOLD_S:g} s")
        runs.append(
            {
                "load_s": load_s,
                "hold_s": HOLD_S,
                "bound_s": BOUND_S,
                "seed": args.seed,
                "models": sum(1 for t in traces if t.requests),
                "requests": sum(t.requests for t in traces),
                "replay_wall_s": wall_s,
                "replay_cpu_s": cpu_s,
                "policies": [r.summary() for r in results],
                "targets": targets,
                "oracle_distance": oracle_distance(results),
                "plot": png.name if not args.no_save else None,
            }
        )
    document = {
        "suite": "keepalive",
        "started_utc": stamp,
        "command": " ".join(["python bench/keepalive.py", *(argv or sys.argv[1:])]),
        "data": str(args.data),
        "machine": machine.describe(REPO_ROOT, load_generator="none (simulation)"),
        "runs": runs,
        "all_targets_met": all_passed,
    }
    if not args.no_save:
        path = RESULTS_DIR / f"{stamp}-{args.tag}-keepalive.json"
        report.write_json(path, document)
        print(f"\nresults: {path.relative_to(REPO_ROOT)}")
    return 0


_VARIANTS: Final[tuple[tuple[str, dict[str, float]], ...]] = (
    ("defaults", {}),
    ("half-life 12 h", {"half_life_s": 43200.0}),
    ("half-life 3 days", {"half_life_s": 3 * 86400.0}),
    ("trusted after 5 idle times", {"min_gaps": 5.0}),
    ("trusted after 20 idle times", {"min_gaps": 20.0}),
    ("fallback 5 min", {"fallback_keep_alive_s": 300.0}),
    ("fallback 20 min", {"fallback_keep_alive_s": 1200.0}),
)
_SENSITIVITY_TARGETS: Final = (0.0003, 0.01)


@dataclass(frozen=True, slots=True)
class _Variant(AdaptivePolicy):
    """The adaptive policy under another name (one row per variant)."""

    label: str = ""

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.label}, target {self.cold_start_target:.2%}"


def sensitivity(
    args: argparse.Namespace, files: list[Path], stamp: str, argv: list[str] | None
) -> int:
    """The adaptive policy with each parameter changed, 20-s loads."""
    load_s = LOAD_TIMES_S[0]
    traces = read_servegen(files, hold_s=HOLD_S, seed=args.seed)
    policies = [
        _Variant(cold_start_target=target, label=label, **changes)
        for label, changes in _VARIANTS
        for target in _SENSITIVITY_TARGETS
    ]
    results = replay(traces, policies, load_s=load_s, bound_s=BOUND_S, oracle=False)
    print("| adaptive policy | cold starts (mean per model) | GPU idle + loading vs always-on |")
    print("| --- | --- | --- |")
    for r in results:
        print(f"| {r.policy} | {r.cold_start_rate:.3%} | {r.wasted_share:.1%} |")
    if not args.no_save:
        path = RESULTS_DIR / f"{stamp}-{args.tag}-keepalive-sensitivity.json"
        report.write_json(
            path,
            {
                "suite": "keepalive-sensitivity",
                "started_utc": stamp,
                "command": " ".join(["python bench/keepalive.py", *(argv or sys.argv[1:])]),
                "load_s": load_s,
                "hold_s": HOLD_S,
                "bound_s": BOUND_S,
                "machine": machine.describe(REPO_ROOT, load_generator="none (simulation)"),
                "policies": [r.summary() for r in results],
            },
        )
        print(f"\nresults: {path.relative_to(REPO_ROOT)}")
    return 0


def gpu_share(r: PolicyResult) -> float:
    """GPU-seconds (serving + idle + loading) as a share of always-on."""
    return (r.serving_s + r.idle_s + r.loading_s) / r.always_on_s


def evaluate(results: list[PolicyResult]) -> list[dict[str, Any]]:
    """The three targets, each with what was compared."""
    fixed = [r for r in results if r.family == "fixed"]
    adaptive = [r for r in results if r.family == "adaptive"]
    hist = next(r for r in results if r.family == "histogram")
    out: list[dict[str, Any]] = []

    def dominated_by(point: PolicyResult) -> PolicyResult | None:
        better = [
            a
            for a in adaptive
            if a.cold_start_rate <= point.cold_start_rate and a.wasted_share < point.wasted_share
        ]
        return min(better, key=lambda a: a.wasted_share) if better else None

    in_range = [f for f in fixed if 0.005 <= f.cold_start_rate <= 0.05]
    pairs = {f.policy: dominated_by(f) for f in in_range}
    out.append(
        {
            "target": "adaptive below every fixed keep-alive from 0.5 % to 5 % cold starts",
            "passed": bool(in_range) and all(v is not None for v in pairs.values()),
            "detail": "; ".join(
                f"{f.policy} ({f.cold_start_rate:.2%}, {f.wasted_share:.1%}) vs "
                + (
                    f"{a.policy} ({a.cold_start_rate:.2%}, {a.wasted_share:.1%})"
                    if (a := pairs[f.policy])
                    else "nothing better"
                )
                for f in in_range
            )
            or "no fixed keep-alive in range",
        }
    )
    fixed_1 = [f for f in fixed if f.cold_start_rate <= 0.01]
    adaptive_1 = [a for a in adaptive if a.cold_start_rate <= 0.01]
    best_fixed = min(fixed_1, key=gpu_share) if fixed_1 else None
    best_adaptive = min(adaptive_1, key=gpu_share) if adaptive_1 else None
    if best_fixed and best_adaptive:
        ratio = gpu_share(best_adaptive) / gpu_share(best_fixed)
        wasted_ratio = best_adaptive.wasted_share / best_fixed.wasted_share
        oracle = next(r for r in results if r.policy == ORACLE)
        out.append(
            {
                "target": "at <= 1 % cold starts, <= 60 % of the GPU-seconds of the best fixed",
                "passed": ratio <= 0.60,
                "ratio": ratio,
                "ratio_idle_loading": wasted_ratio,
                "oracle_ratio": gpu_share(oracle) / gpu_share(best_fixed),
                "detail": f"{best_adaptive.policy} {gpu_share(best_adaptive):.1%} of always-on "
                f"vs {best_fixed.policy} {gpu_share(best_fixed):.1%}: {ratio:.0%} "
                f"(idle + loading only: {wasted_ratio:.0%}; the oracle's: "
                f"{gpu_share(oracle) / gpu_share(best_fixed):.0%})",
            }
        )
    better = [
        a
        for a in adaptive
        if a.cold_start_rate <= hist.cold_start_rate and a.wasted_share < hist.wasted_share
    ]
    best = min(better, key=lambda a: a.wasted_share) if better else None
    out.append(
        {
            "target": "beats the published histogram policy",
            "passed": best is not None,
            "detail": f"{hist.policy} ({hist.cold_start_rate:.3%}, {hist.wasted_share:.1%}) vs "
            + (
                f"{best.policy} ({best.cold_start_rate:.3%}, {best.wasted_share:.1%})"
                if best
                else "nothing better"
            ),
        }
    )
    return out


def oracle_distance(results: list[PolicyResult]) -> str:
    """How far the default adaptive policy stays from the oracle."""
    oracle = next(r for r in results if r.policy == ORACLE)
    default = next((r for r in results if r.policy == DEFAULT_ADAPTIVE), None)
    if default is None or math.isclose(oracle.wasted_share, 0.0):
        return "n/a"
    return (
        f"{default.policy}: idle + loading {default.wasted_share:.1%} of always-on "
        f"({default.idle_share:.1%} idle, {default.loading_share:.1%} loading) at "
        f"{default.cold_start_rate:.3%} cold starts; oracle {oracle.wasted_share:.1%} "
        f"({oracle.idle_share:.1%} idle, {oracle.loading_share:.1%} loading) at 0: "
        f"{default.wasted_share / oracle.wasted_share:.2f}x"
    )


if __name__ == "__main__":
    sys.exit(main())
