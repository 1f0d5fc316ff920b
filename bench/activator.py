"""Activator benchmark: latency and throughput through the activator against straight to the worker.

One ``zeroserve up`` platform (control plane and activator in one process, local workers)
serves one model, registered with ``min_replicas = max_replicas = 1`` so that one worker
holds it for the whole run. That worker is reached two ways: through the activator's public
port, and straight at its own port. At each fixed request rate an open-loop Poisson load of
batch-1 binary requests (``zeroserve bench``'s open loop: latency from the *intended* send
time, so queueing is not hidden) runs both ways back to back, the first way alternating; repeats
visit the rates ascending, then descending; medians are reported. Each repeat also measures
each way's capacity with a closed loop (wrk, 8 connections), and the targets are judged at
the rates at or below half of the activator's capacity ("below saturation"):

* the activator adds at most 1 ms at p50, and
* at most 3 ms at p99.

Every request is checked once against ONNX Runtime before anything is timed. Results go to
``bench/results/<UTC time>-<tag>-activator.json``; ``--profile`` samples the platform
process with py-spy under activator load instead and writes ``...-activator-profile.txt``.

    python bench/activator.py              # full run (about 4.5 minutes)
    python bench/activator.py --quick      # smoke run, under a minute
    python bench/activator.py --profile    # where the activator's time goes
"""

from __future__ import annotations

import argparse
import contextlib
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

# Run as a script, sys.path[0] is bench/; the repository root must come first so that
# `bench` is a package and `activator` names the activator, not this file.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench import engine as engine_module, machine, models, profiling, report
from bench.loadgen import BenchLoad, LoadGenerator, Target, WrkLoad, load_plan
from bench.platform_process import PlatformProcess
from bench.server import HOST, REPO_ROOT, infer_once, process_cpu_seconds
from zeroserve.bench import LevelResult, run_open

RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
DIRECT: Final = "direct"
ACTIVATOR: Final = "activator"
SATURATION_SHARE: Final = 0.5
"""A rate is "below saturation" at or below this share of the activator's capacity."""
ADDED_P50_MS: Final = 1.0
ADDED_P99_MS: Final = 3.0
MAX_CONNECTIONS: Final = 256
"""The open loop's connections at most (a request with none idle waits, its latency running)."""


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--rates", default="100,200,300,400", help="requests per second")
    parser.add_argument("--duration", type=float, default=8.0, help="timed seconds per point")
    parser.add_argument("--warmup", type=float, default=1.0, help="untimed seconds per point")
    parser.add_argument("--repeats", type=int, default=3, help="passes over all points; medians")
    parser.add_argument("--capacity-duration", type=int, default=4, help="seconds per probe")
    parser.add_argument("--capacity-connections", type=int, default=8)
    parser.add_argument("--model", choices=["demo", "light"], default="demo")
    parser.add_argument("--seed", type=int, default=0, help="seed of the arrival schedules")
    parser.add_argument("--quick", action="store_true", help="2 s points, 1 repeat, 2 rates")
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    parser.add_argument(
        "--access-log",
        choices=["on", "off", "both"],
        default="on",
        help="the activator's access log; both: a platform with it and one without, measured "
        "in turns in this run, and the log's cost (the first's added latency and CPU less "
        "the second's)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the platform instead")
    parser.add_argument("--profile-rate", type=float, default=400.0)
    parser.add_argument("--top", type=int, default=30, help="functions per profile ranking")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.repeats, args.capacity_duration = 2.0, 0.5, 1, 2
        args.rates = "100,400"
    args.rate_list = [float(x) for x in args.rates.split(",") if x.strip()]
    if args.duration <= 0 or args.warmup < 0 or args.repeats < 1 or not args.rate_list:
        parser.error("--duration must be > 0, --warmup >= 0, --repeats >= 1, --rates non-empty")
    return args


@dataclass
class _Point:
    """One rate on one path, with its repeats."""

    rate: float
    path: str
    repeats: list[dict[str, Any]] = field(default_factory=list)

    def median(self, key: str) -> float:
        return report.median_of(self.repeats, key)


@dataclass(frozen=True)
class _Setup:
    """The platform, the model and the two ways to reach its worker."""

    platform: PlatformProcess
    model: str
    body: models.RequestBody
    worker_port: int
    worker_pid: int

    def target(self, path: str) -> Target:
        port = self.worker_port if path == DIRECT else self.platform.port
        return Target(HOST, port, f"/v2/models/{self.model}/infer")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    started = time.monotonic()
    started_utc = datetime.now(UTC)
    stamp = started_utc.strftime("%Y-%m-%dT%H%M%SZ")
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", args.tag or socket.gethostname()).strip("-") or "host"
    with tempfile.TemporaryDirectory(prefix="zeroserve-bench-activator-") as tmp:
        workdir = Path(tmp)
        model, spec, model_dir = _write_model(args.model, workdir / "models")
        loadgen: LoadGenerator = WrkLoad(workdir) if WrkLoad.is_available() else BenchLoad()
        variants = ["on", "off"] if args.access_log == "both" else [args.access_log]
        with contextlib.ExitStack() as stack:
            setups: dict[str, _Setup] = {}
            for variant in variants:
                platform = stack.enter_context(
                    PlatformProcess(
                        workdir,
                        cache_dir=workdir / f"cache-{variant}",
                        allowed_storage=(str(workdir / "models"),),
                        env={"ZEROSERVE_ACTIVATOR_ACCESS_LOG": str(variant == "on").lower()},
                        name=f"platform-log-{variant}",
                    )
                )
                setups[variant] = _start_model(platform, model, spec, model_dir)
            setup = setups[variants[0]]
            if args.profile:
                return _profile(args, setup, stamp, tag)
            measured = _measure_variants(args, setups, loadgen)
            points, capacity = measured[variants[0]]
            commands = {"platform": setup.platform.command}
            if isinstance(loadgen, WrkLoad):
                commands["capacity"] = loadgen.command(
                    setup.target(ACTIVATOR),
                    setup.body,
                    connections=args.capacity_connections,
                    duration_s=args.capacity_duration,
                )
    activator_capacity = statistics.median(capacity[ACTIVATOR])
    limit = SATURATION_SHARE * activator_capacity
    targets = _targets(points, args.rate_list, limit)
    print(_table(points, args.rate_list, capacity, limit, spec, model))
    if "off" in measured and len(measured) == 2:
        off_points, off_capacity = measured["off"]
        table = _table(off_points, args.rate_list, off_capacity, limit, spec, model)
        print(f"\nwithout the access log (second platform):{table}")
        print(_cost_table(measured["on"], measured["off"], args.rate_list))
    print(report.targets_text(targets))
    document: dict[str, Any] = {
        "benchmark": "activator",
        "started_utc": started_utc.isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - started, 1),
        "argv": sys.argv,
        "quick": args.quick,
        "machine": machine.describe(REPO_ROOT, load_generator=_client_name(loadgen)),
        "settings": {
            "model": model,
            "model_widths": list(spec.widths),
            "encoding": "binary",
            "batch_size": 1,
            "rates": args.rate_list,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "repeats": args.repeats,
            "seed": args.seed,
            "order": "rates ascending on even repeats, descending on odd; at each rate both "
            "paths back to back, direct first on even (rate index + repeat), else activator",
            "open_loop": "Poisson arrivals, latency from the intended send time "
            f"(zeroserve bench's open loop, in this process, at most {MAX_CONNECTIONS} "
            "connections)",
            "capacity": f"closed loop, {args.capacity_connections} connections, "
            f"{args.capacity_duration} s, {loadgen.name}",
            "below_saturation": f"rate <= {SATURATION_SHARE} x the activator's median capacity",
            "commands": commands,
        },
        "capacity": {
            path: {"median_per_s": statistics.median(values), "repeats": values}
            for path, values in capacity.items()
        },
        "points": [
            {
                "rate": p.rate,
                "path": p.path,
                "median": {k: p.median(k) for k in _MEDIAN_KEYS},
                "repeats": p.repeats,
            }
            for p in points
        ],
        "added": _added_json(points, args.rate_list),
        "targets": [asdict(t) | {"passed": t.passed} for t in targets],
        "access_log": variants[0],
    }
    if len(measured) == 2:
        off_points, off_capacity = measured["off"]
        document["without_access_log"] = {
            "capacity": {
                path: {"median_per_s": statistics.median(values), "repeats": values}
                for path, values in off_capacity.items()
            },
            "points": [
                {"rate": p.rate, "path": p.path, "median": {k: p.median(k) for k in _MEDIAN_KEYS}}
                for p in off_points
            ],
            "added": _added_json(off_points, args.rate_list),
        }
        document["access_log_cost"] = _cost_json(measured["on"], measured["off"], args.rate_list)
    if not args.no_save:
        path = RESULTS_DIR / f"{stamp}-{tag}-activator{'-quick' if args.quick else ''}.json"
        report.write_json(path, document)
        print(f"\nresults: {path.relative_to(REPO_ROOT)} ({document['wall_s']:.0f} s)")
    return 0


def _write_model(name: str, root: Path) -> tuple[str, models.MlpSpec, Path]:
    """The model's repository name, its shape (for request bodies) and its folder."""
    if name == "demo":
        from data_plane.demo import DEMO_MODEL, DEMO_WIDTHS, write_demo_repository

        return DEMO_MODEL, models.MlpSpec(DEMO_MODEL, DEMO_WIDTHS), write_demo_repository(root)
    spec = models.MODELS[name]
    models.write_repository(root, [spec], max_queue_delay_us=0)
    return spec.name, spec, root / spec.name


def _start_model(
    platform: PlatformProcess, model: str, spec: models.MlpSpec, model_dir: Path
) -> _Setup:
    """Register the model with one replica, wait for it, and check both paths' answers."""
    platform.register(model, str(model_dir), {"min_replicas": 1, "max_replicas": 1})
    platform.load(model)
    [worker] = [w for w in platform.workers() if model in w["models"]]
    worker_port = int(str(worker["url"]).rsplit(":", 1)[1])
    body = models.request_body(spec, models.sample_rows(spec, 1), "binary")
    setup = _Setup(platform, model, body, worker_port, int(worker["details"]["pid"]))
    row = models.sample_rows(spec, 1)
    expected = engine_module.Engine(model_dir / "1" / "model.onnx").run(row)
    for path in (DIRECT, ACTIVATOR):
        port = setup.target(path).port
        served = infer_once(port, model, body)
        if served.shape != expected.shape or not np.allclose(served, expected, 1e-3, 1e-4):
            raise RuntimeError(f"{path}: the answer differs from ONNX Runtime's")
    print(f"verified: {model} answers ONNX Runtime's output directly and through the activator")
    return setup


_Measured = tuple[list["_Point"], dict[str, list[float]]]


def _measure_variants(
    args: argparse.Namespace, setups: dict[str, _Setup], loadgen: LoadGenerator
) -> dict[str, _Measured]:
    """Each platform's points and capacities; with two, a repeat of one and then of the
    other, the first alternating, so that both see the same machine over the run."""
    points = {
        variant: {(r, p): _Point(r, p) for r in args.rate_list for p in (DIRECT, ACTIVATOR)}
        for variant in setups
    }
    capacity: dict[str, dict[str, list[float]]] = {
        variant: {DIRECT: [], ACTIVATOR: []} for variant in setups
    }
    count = len(setups) * 2 * len(args.rate_list)
    per_repeat = 2 * len(setups) * (args.capacity_duration + 1) + count * (
        args.duration + args.warmup
    )
    print(
        f"{count} points x {args.repeats} repeats, ~{args.repeats * per_repeat / 60:.1f} "
        f"min; open loop in this process, capacity: {loadgen.name}",
        flush=True,
    )
    variants = list(setups)
    for repeat in range(args.repeats):
        for variant in variants if repeat % 2 == 0 else variants[::-1]:
            if len(variants) > 1:
                print(f"[{repeat + 1}/{args.repeats}] access log {variant}", file=sys.stderr)
            _measure_repeat(
                args, setups[variant], loadgen, repeat, points[variant], capacity[variant]
            )
    return {v: (list(points[v].values()), capacity[v]) for v in variants}


def _measure_repeat(
    args: argparse.Namespace,
    setup: _Setup,
    loadgen: LoadGenerator,
    repeat: int,
    points: dict[tuple[float, str], _Point],
    capacity: dict[str, list[float]],
) -> None:
    """One repeat on one platform: both capacities, then every rate both ways."""
    order = (DIRECT, ACTIVATOR) if repeat % 2 == 0 else (ACTIVATOR, DIRECT)
    for path in order:
        target = setup.target(path)
        loadgen.run(target, setup.body, connections=args.capacity_connections, duration_s=1)
        probe = loadgen.run(
            target,
            setup.body,
            connections=args.capacity_connections,
            duration_s=args.capacity_duration,
        )
        capacity[path].append(probe.throughput)
        print(
            f"[{repeat + 1}/{args.repeats}] capacity {path:<9} {probe.throughput:8.1f}/s  "
            f"p50 {probe.p50_ms:6.2f} ms  errors {probe.error_count}",
            file=sys.stderr,
            flush=True,
        )
    rates = args.rate_list if repeat % 2 == 0 else args.rate_list[::-1]
    for index, rate in enumerate(rates):
        first = (DIRECT, ACTIVATOR) if (index + repeat) % 2 == 0 else (ACTIVATOR, DIRECT)
        for path in first:
            seed = args.seed * 1_000_003 + repeat * 1009 + int(rate)
            record = _run_point(args, setup, path, rate, seed)
            points[(rate, path)].repeats.append(record)
            print(
                f"[{repeat + 1}/{args.repeats}] {rate:6.0f}/s {path:<9} "
                f"{record['throughput']:7.1f}/s  p50 {record['p50_ms']:6.2f} ms  "
                f"p99 {record['p99_ms']:6.2f} ms  errors {record['error_count']}",
                file=sys.stderr,
                flush=True,
            )


def _run_point(
    args: argparse.Namespace, setup: _Setup, path: str, rate: float, seed: int
) -> dict[str, Any]:
    platform_cpu = setup.platform.cpu_seconds()
    worker_cpu = process_cpu_seconds(setup.worker_pid)
    busy = machine.busy_cpu_seconds()
    started = time.perf_counter()
    result = _open_loop(
        setup, path, rate, duration_s=args.duration, warmup_s=args.warmup, seed=seed
    )
    wall = time.perf_counter() - started
    platform_cpu = (setup.platform.cpu_seconds() - platform_cpu) / wall
    worker_cpu = (process_cpu_seconds(setup.worker_pid) - worker_cpu) / wall
    busy = (machine.busy_cpu_seconds() - busy) / wall
    other = max(busy - platform_cpu - worker_cpu - result.client_cpu_cores, 0.0)
    return _record(result) | {
        "platform_cpu_cores": platform_cpu,
        "worker_cpu_cores": worker_cpu,
        "other_cpu_cores": other,
    }


def _open_loop(
    setup: _Setup, path: str, rate: float, *, duration_s: float, warmup_s: float, seed: int
) -> LevelResult:
    requests = load_plan(setup.target(path), setup.body, duration_s=duration_s, warmup_s=warmup_s)
    return run_open(requests, rate, seed=seed, max_connections=MAX_CONNECTIONS)


def _record(result: LevelResult) -> dict[str, Any]:
    """One point's figures, flat: latency from the intended send, service latency from the
    actual one."""
    latency, service = result.latency, result.service_latency
    assert service is not None and result.offered_rate is not None
    return {
        "rate": result.level,
        "offered_rate": result.offered_rate,
        "ok": result.ok,
        "errors": result.errors,
        "error_count": result.error_count,
        "duration_s": result.duration_s,
        "throughput": result.throughput,
        "p50_ms": latency.p50_ms,
        "p90_ms": latency.p90_ms,
        "p99_ms": latency.p99_ms,
        "p999_ms": latency.p999_ms,
        "mean_ms": latency.mean_ms,
        "max_ms": latency.max_ms,
        "service_p50_ms": service.p50_ms,
        "service_p99_ms": service.p99_ms,
        "send_lag_p99_ms": result.send_lag_p99_ms,
        "connections": result.connections,
        "client_cpu_cores": result.client_cpu_cores,
    }


_MEDIAN_KEYS: Final = (
    "throughput",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "p999_ms",
    "service_p50_ms",
    "service_p99_ms",
    "send_lag_p99_ms",
    "platform_cpu_cores",
    "worker_cpu_cores",
    "client_cpu_cores",
    "other_cpu_cores",
)


def _find(points: list[_Point], rate: float, path: str) -> _Point:
    return next(p for p in points if p.rate == rate and p.path == path)


def _added(points: list[_Point], rate: float, key: str) -> float:
    """Median through the activator minus median straight to the worker."""
    return _find(points, rate, ACTIVATOR).median(key) - _find(points, rate, DIRECT).median(key)


def _paired_added(points: list[_Point], rate: float, key: str) -> float:
    """Median over repeats of (activator - direct), each pair measured back to back."""
    pairs = zip(
        _find(points, rate, ACTIVATOR).repeats, _find(points, rate, DIRECT).repeats, strict=True
    )
    return statistics.median(float(a[key]) - float(d[key]) for a, d in pairs)


def _added_json(points: list[_Point], rates: list[float]) -> list[dict[str, Any]]:
    return [
        {
            "rate": rate,
            **{f"{k}_diff_of_medians": _added(points, rate, k) for k in ("p50_ms", "p99_ms")},
            **{
                f"{k}_median_of_pairs": _paired_added(points, rate, k) for k in ("p50_ms", "p99_ms")
            },
            "platform_cpu_ms_per_request": _cpu_per_request(points, rate),
        }
        for rate in rates
    ]


def _cpu_per_request(points: list[_Point], rate: float) -> float:
    """The platform's CPU per request through the activator, less its idle CPU (direct)."""
    through = _find(points, rate, ACTIVATOR)
    idle = _find(points, rate, DIRECT).median("platform_cpu_cores")
    return (through.median("platform_cpu_cores") - idle) / through.median("throughput") * 1e3


def _targets(points: list[_Point], rates: list[float], limit: float) -> list[report.Target]:
    targets: list[report.Target] = []
    for rate in rates:
        if rate > limit:
            continue
        for key, threshold in (("p50_ms", ADDED_P50_MS), ("p99_ms", ADDED_P99_MS)):
            name = key.removesuffix("_ms")
            targets.append(
                report.Target(
                    f"added_{name}_at_{rate:g}_per_s",
                    f"{rate:g}/s: activator adds <= {threshold:g} ms at {name}",
                    _added(points, rate, key),
                    threshold,
                    is_max=True,
                )
            )
    return targets


def _table(
    points: list[_Point],
    rates: list[float],
    capacity: dict[str, list[float]],
    limit: float,
    spec: models.MlpSpec,
    model: str,
) -> str:
    header = (
        f"{'rate/s':>7} {'path':<10}{'done/s':>8}{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}"
        f"{'svc p50':>8}{'lag p99':>8}{'plat cpu':>9}{'wrk cpu':>8}{'cli cpu':>8}{'other':>7}"
        f"{'errors':>7}"
    )
    lines = [
        "",
        f"{model} ({spec.description}), batch-1 binary requests, open loop (Poisson); "
        f"medians of {len(points[0].repeats)} repeats",
        header,
        "-" * len(header),
    ]
    for rate in rates:
        for path in (DIRECT, ACTIVATOR):
            p = _find(points, rate, path)
            errors = sum(int(r["error_count"]) for r in p.repeats)
            lines.append(
                f"{rate:>7g} {path:<10}{p.median('throughput'):>8.1f}{p.median('p50_ms'):>8.2f}"
                f"{p.median('p90_ms'):>8.2f}{p.median('p99_ms'):>8.2f}"
                f"{p.median('service_p50_ms'):>8.2f}{p.median('send_lag_p99_ms'):>8.2f}"
                f"{p.median('platform_cpu_cores'):>9.2f}{p.median('worker_cpu_cores'):>8.2f}"
                f"{p.median('client_cpu_cores'):>8.2f}{p.median('other_cpu_cores'):>7.2f}"
                f"{errors:>7d}"
            )
        mark = "" if rate <= limit else "  (above half the capacity: not judged)"
        lines.append(
            f"{'':>7} {'added':<10}{'':>8}{_added(points, rate, 'p50_ms'):>+8.2f}"
            f"{_added(points, rate, 'p90_ms'):>+8.2f}{_added(points, rate, 'p99_ms'):>+8.2f}"
            f"   platform CPU {_cpu_per_request(points, rate):.2f} ms/request{mark}"
        )
    cap = {k: statistics.median(v) for k, v in capacity.items()}
    others = [r["other_cpu_cores"] for p in points for r in p.repeats]
    noise = statistics.mean(others) if others else 0.0
    if noise > report.NOISY_OTHER_CORES:
        lines += [
            "",
            f"WARNING: other processes used {noise:.2f} cores on average while points were "
            "measured; compare repeats before trusting small differences.",
        ]
    lines += [
        "",
        f"capacity (closed loop): direct {cap[DIRECT]:.0f}/s, activator {cap[ACTIVATOR]:.0f}/s; "
        f"judged below saturation: rates <= {limit:.0f}/s",
        "",
        "p50/p90/p99: from the intended send time to the answer's last byte; svc p50: from the "
        "actual send; lag p99: actual - intended send (the client's own delay); cpu: cores used "
        "by the platform process (control plane + activator), the worker, this client; other: "
        "the rest of the machine (noise); added: activator median - direct median.",
    ]
    return "\n".join(lines)


def _cost_json(on: _Measured, off: _Measured, rates: list[float]) -> dict[str, Any]:
    """What the access log costs: each platform's added latency (its activator less its
    worker) and CPU per request, the platform with the log less the one without."""
    (on_points, on_capacity), (off_points, off_capacity) = on, off
    capacity_on = statistics.median(on_capacity[ACTIVATOR])
    capacity_off = statistics.median(off_capacity[ACTIVATOR])
    return {
        "activator_capacity_per_s": {"on": capacity_on, "off": capacity_off},
        "capacity_ratio": capacity_on / capacity_off,
        "rates": [
            {
                "rate": rate,
                **{
                    f"added_{key}": {
                        "on": _added(on_points, rate, key),
                        "off": _added(off_points, rate, key),
                        "cost": _added(on_points, rate, key) - _added(off_points, rate, key),
                    }
                    for key in ("p50_ms", "p99_ms")
                },
                "platform_cpu_ms_per_request": {
                    "on": _cpu_per_request(on_points, rate),
                    "off": _cpu_per_request(off_points, rate),
                    "cost": _cpu_per_request(on_points, rate) - _cpu_per_request(off_points, rate),
                },
            }
            for rate in rates
        ],
    }


def _cost_table(on: _Measured, off: _Measured, rates: list[float]) -> str:
    cost = _cost_json(on, off, rates)
    header = (
        f"{'rate/s':>7}{'added p50 on/off ms':>22}{'cost':>8}{'added p99 on/off ms':>22}"
        f"{'cost':>8}{'cpu/req on/off ms':>20}{'cost us':>9}"
    )
    lines = ["", "access log cost (platform with it less platform without)", header]
    for row in cost["rates"]:
        p50, p99, cpu = row["added_p50_ms"], row["added_p99_ms"], row["platform_cpu_ms_per_request"]
        lines.append(
            f"{row['rate']:>7g}{p50['on']:>14.3f} /{p50['off']:>6.3f}{p50['cost']:>+8.3f}"
            f"{p99['on']:>14.3f} /{p99['off']:>6.3f}{p99['cost']:>+8.3f}"
            f"{cpu['on']:>12.3f} /{cpu['off']:>6.3f}{cpu['cost'] * 1000:>+9.1f}"
        )
    caps = cost["activator_capacity_per_s"]
    lines.append(
        f"activator capacity (closed loop): {caps['on']:.0f}/s with the log, "
        f"{caps['off']:.0f}/s without ({cost['capacity_ratio']:.3f}x)"
    )
    return "\n".join(lines)


def _client_name(loadgen: LoadGenerator) -> str:
    return f"open loop: zeroserve bench's, in process; capacity: {loadgen.name}"


def _profile(args: argparse.Namespace, setup: _Setup, stamp: str, tag: str) -> int:
    """py-spy on the platform process while the activator takes ``--profile-rate``."""
    if not profiling.pyspy_available():
        raise SystemExit("py-spy is not installed (pip install py-spy)")
    duration = max(int(args.duration), 1)
    with tempfile.TemporaryDirectory(prefix="zeroserve-bench-pyspy-") as tmp:
        raw = Path(tmp) / "pyspy-raw.txt"
        _open_loop(setup, ACTIVATOR, args.profile_rate, duration_s=2, warmup_s=0, seed=1)
        pid = setup.platform.pid
        command = profiling.pyspy_command(pid, raw, duration, native=False)
        spy = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            before = profiling.thread_cpu_seconds(pid)
            result = _open_loop(
                setup, ACTIVATOR, args.profile_rate, duration_s=duration, warmup_s=0, seed=2
            )
            after = profiling.thread_cpu_seconds(pid)
            output, _ = spy.communicate(timeout=duration + 60)
        finally:
            if spy.poll() is None:
                spy.kill()
                spy.wait()
        if spy.returncode != 0 or not raw.is_file():
            raise RuntimeError(f"py-spy failed (exit {spy.returncode}): {output.strip()[-500:]}")
        folded = profiling.fold_pyspy(raw, REPO_ROOT)
    description = machine.describe(REPO_ROOT, load_generator="zeroserve bench's open loop")
    text = "\n\n".join(
        [
            f"zeroserve activator profile, {stamp}\n"
            f"machine: {description['cpu_model']}, {description['cpus_usable']} CPUs, "
            f"Python {description['python']}; git {description['git']['commit']} "
            f"(dirty: {description['git']['dirty']})\n"
            f"command: {' '.join(command)}\n"
            f"load: {setup.model}, batch-1 binary, open loop {args.profile_rate:g}/s through "
            f"the activator for {duration} s: {result.throughput:.1f}/s, p50 "
            f"{result.latency.p50_ms:.2f} ms, p99 {result.latency.p99_ms:.2f} ms, errors "
            f"{result.error_count}",
            profiling.thread_cpu_text(pid, before, after, float(duration), folded.thread_names),
            profiling.pyspy_text(folded, top=args.top),
        ]
    )
    print(text)
    if not args.no_save:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{stamp}-{tag}-activator-profile.txt"
        path.write_text(text + "\n", encoding="utf-8")
        print(f"profile: {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
