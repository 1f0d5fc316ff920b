"""``zeroserve simulate``: replay a traffic trace through the keep-alive policies.

Reads a ServeGen folder or file (``language/m-mid`` format) or a plain ``timestamp,model``
CSV, replays it on a simulated clock through the control plane's own policy functions
(``control_plane.keepalive``), and prints per policy the cold-start rate, the latency cold
starts add, and the GPU time held idle and spent loading as a share of always-on; with
``--plot``, cold starts against GPU time, one curve per policy family.

Load times: ``--load-s`` for every model, ``--load-times`` per model from a file, or, with
``--load-times-from-api``, each registered model's median measured cold start (the
activation timelines' ``durations_s.total``) read from the admin API.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foundation.output import emit

if TYPE_CHECKING:
    # Imported where used: building the command line must stay cheap (numpy).
    from control_plane.keepalive.policies import KeepAlivePolicy
    from control_plane.keepalive.replay import PolicyResult
    from control_plane.keepalive.traces import ModelTrace
    from control_plane.settings import AdminClientSettings

__all__ = [
    "FIXED_KEEP_ALIVES_S",
    "ADAPTIVE_TARGETS",
    "add_simulate_parser",
    "default_policies",
    "load_trace",
    "main",
    "median_load_s",
    "plot",
    "result_json",
    "table",
]

FIXED_KEEP_ALIVES_S = (5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0)
"""The fixed family: RunPod's 5 s, Knative's and Modal's 60 s, AWS Lambda's ~10 min,
Azure Functions' 20 min, zeroserve's 5 min default, and points between."""
ADAPTIVE_TARGETS = (0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3)
"""The adaptive family's cold-start targets (1 % is the default)."""


def default_policies() -> list[KeepAlivePolicy]:
    """Always-on, the fixed family, the published histogram policy, the adaptive family."""
    from control_plane.keepalive.policies import (
        AdaptivePolicy,
        AlwaysOnPolicy,
        FixedPolicy,
        HybridHistogramPolicy,
    )

    fixed: list[KeepAlivePolicy] = [
        FixedPolicy(k, label="knative 60 s" if k == 60.0 else "") for k in FIXED_KEEP_ALIVES_S
    ]
    adaptive: list[KeepAlivePolicy] = [
        AdaptivePolicy(cold_start_target=t) for t in ADAPTIVE_TARGETS
    ]
    return [AlwaysOnPolicy(), *fixed, HybridHistogramPolicy(), *adaptive]


def families(policies: Sequence[KeepAlivePolicy]) -> dict[str, str]:
    """Each policy's curve: ``fixed`` (Knative's 60 s among them), ``adaptive``, and one
    point each for the others."""
    from control_plane.keepalive.policies import (
        AdaptivePolicy,
        FixedPolicy,
        HybridHistogramPolicy,
    )

    out = {}
    for p in policies:
        if isinstance(p, FixedPolicy):
            out[p.name] = "fixed"
        elif isinstance(p, AdaptivePolicy):
            out[p.name] = "adaptive"
        elif isinstance(p, HybridHistogramPolicy):
            out[p.name] = "histogram"
        else:
            out[p.name] = p.name
    return out


def add_simulate_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "simulate",
        help="replay a traffic trace through the keep-alive policies",
        description="Replay a trace (a ServeGen folder or file, or a timestamp,model CSV) "
        "through zeroserve's keep-alive policies on a simulated clock and compare cold "
        "starts with the GPU time they cost.",
    )
    parser.add_argument("trace", type=Path, help="ServeGen folder/file or timestamp,model CSV")
    parser.add_argument(
        "--format", choices=["auto", "servegen", "plain"], default="auto", help="trace format"
    )
    parser.add_argument("--load-s", type=float, default=20.0, help="load time of every model")
    parser.add_argument(
        "--load-times",
        type=Path,
        default=None,
        help="JSON object of model name -> load seconds (others get --load-s)",
    )
    parser.add_argument(
        "--load-times-from-api",
        action="store_true",
        help="each model's median measured load time from the admin API's activation "
        "timelines (models never activated get --load-times or --load-s)",
    )
    parser.add_argument(
        "--url",
        default=None,
        help="with --load-times-from-api: the admin API (default: ZEROSERVE_ADMIN_URL, else "
        "the one `zeroserve login` or `zeroserve up` stored)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="with --load-times-from-api: the admin token (default: ZEROSERVE_ADMIN_TOKEN, "
        "else the one stored for the URL)",
    )
    parser.add_argument(
        "--hold-s", type=float, default=5.0, help="how long each request holds a replica"
    )
    parser.add_argument(
        "--idle-timeout-s",
        type=float,
        default=4 * 3600.0,
        help="each model's idle_timeout_s: the longest any learned plan keeps it",
    )
    parser.add_argument("--seed", type=int, default=0, help="ServeGen: arrival draws")
    parser.add_argument(
        "--replan-s", type=float, default=600.0, help="how often plans are refreshed"
    )
    parser.add_argument("--plot", type=Path, default=None, help="write the curves to this PNG")
    parser.add_argument(
        "-o",
        "--output",
        choices=["table", "json", "yaml"],
        default="table",
        help="table: one Markdown row per policy; json or yaml: every figure, for scripts",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        help="how much the command logs: debug, info, warning or error",
    )
    return parser


def load_trace(path: Path, *, fmt: str, hold_s: float, seed: int) -> list[ModelTrace]:
    """The models of a trace file or ServeGen folder."""
    from control_plane.keepalive.traces import read_plain_csv, read_servegen, servegen_files

    if fmt == "auto":
        fmt = "servegen" if path.is_dir() or path.name.endswith("-trace.csv") else "plain"
    if fmt == "servegen":
        files = servegen_files(path) if path.is_dir() else [path]
        if not files:
            raise ValueError(f"{path}: no *-trace.csv files")
        return read_servegen(files, hold_s=hold_s, seed=seed)
    return read_plain_csv(path, hold_s=hold_s)


def main(args: argparse.Namespace, *, admin: AdminClientSettings | None = None) -> int:
    """Run the command; ``admin`` is where ``--load-times-from-api`` reads (required then)."""
    started = time.process_time(), time.perf_counter()
    try:
        traces = load_trace(args.trace, fmt=args.format, hold_s=args.hold_s, seed=args.seed)
        load: float | dict[str, float] = args.load_s
        given: dict[str, float] = {}
        if args.load_times is not None:
            given = json.loads(args.load_times.read_text(encoding="utf-8"))
        if args.load_times_from_api:
            if admin is None:
                raise ValueError("--load-times-from-api: no admin API settings")
            measured = _measured_load_times(admin, [t.name for t in traces])
            if measured is None:
                return 2
            given = {**given, **measured}
        if given:
            load = {t.name: float(given.get(t.name, args.load_s)) for t in traces}
    except (OSError, ValueError) as exc:
        print(f"zeroserve simulate: {exc}", file=sys.stderr)
        return 2
    from control_plane.keepalive.replay import replay

    policies = default_policies()
    results = replay(
        traces,
        policies,
        load_s=load,
        bound_s=args.idle_timeout_s,
        replan_s=args.replan_s,
        families=families(policies),
    )
    cpu_s = time.process_time() - started[0]
    wall_s = time.perf_counter() - started[1]
    if args.output in ("json", "yaml"):
        doc = {
            "models": sum(1 for t in traces if t.requests),
            "requests": sum(t.requests for t in traces),
            "load_s": load,
            "cpu_s": cpu_s,
            "wall_s": wall_s,
            "policies": [r.summary() for r in results],
        }
        emit(doc, (), args.output)
    else:
        print(table(results))
        print(
            f"{sum(1 for t in traces if t.requests)} models, "
            f"{sum(t.requests for t in traces):,} requests; "
            f"replayed in {wall_s:.1f} s ({cpu_s:.1f} s CPU)"
        )
    if args.plot is not None:
        plot(results, args.plot, title=str(args.trace.name))
    return 0


def median_load_s(timelines: Sequence[dict[str, Any]]) -> float | None:
    """The median time to ready (``durations_s.total``) over a model's activations that
    loaded it (outcome ``ready``: a revived or woken replica did not load), or None when
    none did. The reaper reads the same field for its plans."""
    import statistics

    totals = [
        float(total)
        for t in timelines
        if t.get("outcome") == "ready"
        and isinstance(total := (t.get("durations_s") or {}).get("total"), (int, float))
        and total >= 0
    ]
    return statistics.median(totals) if totals else None


def _measured_load_times(
    settings: AdminClientSettings, names: Sequence[str]
) -> dict[str, float] | None:
    """Median measured load time of each trace model registered with the admin API; None
    (after saying why on stderr) when the API cannot be asked."""
    import httpx

    from control_plane.api.client import AdminApiError, AdminClient

    where = "zeroserve simulate --load-times-from-api"
    if settings.token is None:
        print(
            f"{where}: no admin token for {settings.url}: run `zeroserve login`, or pass "
            "--token or set ZEROSERVE_ADMIN_TOKEN",
            file=sys.stderr,
        )
        return None
    from urllib.parse import quote

    client = AdminClient(settings)
    measured: dict[str, float] = {}
    try:
        registered = {m["name"] for m in client.call("GET", "/models")["models"]}
        for name in names:
            if name not in registered:
                continue
            doc = client.call("GET", f"/models/{quote(name, safe='')}/activations")
            median = median_load_s(doc.get("activations") or [])
            if median is not None:
                measured[name] = median
    except AdminApiError as exc:
        print(f"{where}: {settings.url} answered {exc}", file=sys.stderr)
        return None
    except httpx.HTTPError as exc:
        print(f"{where}: cannot reach the admin API at {settings.url} ({exc})", file=sys.stderr)
        return None
    finally:
        client.close()
    return measured


def table(results: Sequence[PolicyResult]) -> str:
    """A Markdown table, one row per policy."""
    head = (
        "| policy | cold starts (mean/model) | p75 model | added latency p50 / p99 / p99.9 "
        "| idle | loading | idle + loading vs always-on | activations/h |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    rows = [head]
    for r in results:
        rows.append(
            f"| {r.policy} | {r.cold_start_rate:.3%} | {r.cold_start_rate_p75:.3%} "
            f"| {r.latency_percentile(50):.0f} / {r.latency_percentile(99):.0f} / "
            f"{r.latency_percentile(99.9):.0f} s | {r.idle_share:.1%} | {r.loading_share:.1%} "
            f"| {r.wasted_share:.1%} | {r.activations_per_hour:.1f} |"
        )
    return "\n".join(rows)


def plot(results: Sequence[PolicyResult], path: Path, *, title: str) -> None:
    """Cold starts (x, log) against idle + loading GPU time (y), a curve per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    by_family: dict[str, list[PolicyResult]] = {}
    for r in results:
        by_family.setdefault(r.family, []).append(r)
    floor = 1e-5
    for family, members in by_family.items():
        points = sorted(
            ((max(r.cold_start_rate, floor), r.wasted_share, r.policy) for r in members),
            key=lambda p: p[0],
        )
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        style = "o-" if len(points) > 1 else "s"
        ax.plot(xs, ys, style, label=family)
    ax.set_xscale("log")
    ax.set_xlabel("cold starts (mean share of each model's requests; none drawn at 1e-5)")
    ax.set_ylabel("GPU time idle + loading, share of always-on")
    ax.set_title(f"keep-alive policies on {title}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def result_json(results: Sequence[PolicyResult]) -> list[dict[str, Any]]:
    """The rows of :func:`table` as JSON."""
    return [r.summary() for r in results]
