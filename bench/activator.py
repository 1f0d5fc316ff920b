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

With ``--keys`` the two ways are instead two platforms of the same run, each holding the
model on a worker of its own: one with API keys off, one with keys on and a key whose
limits (rate, burst, in flight, activations) are all set, high enough never to refuse, so
that every request pays for checking them. Targets: keys add at most 0.05 ms at p50 and
0.2 ms at p99, and keep the capacity within 10 %.

Every request is checked once against ONNX Runtime before anything is timed. Results go to
``bench/results/<UTC time>-<tag>-activator.json``; ``--profile`` samples the platform
process with py-spy under activator load instead and writes ``...-activator-profile.txt``.

    python bench/activator.py              # full run (about 4.5 minutes)
    python bench/activator.py --quick      # smoke run, under a minute
    python bench/activator.py --profile    # where the activator's time goes
    python bench/activator.py --keys       # API keys and quotas on against off
    python bench/activator.py --keys --same  # the same, both platforms keys off: noise floor
                                             # (the same header sent, unchecked)
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

from bench import (
    engine as engine_module,
    gate_cost as gate_cost_module,
    machine,
    models,
    profiling,
    report,
)
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
_UNCHECKED_KEY: Final = "zs_0123456789ab_" + "A" * 43
"""What the A/A run sends in place of a key: the shape of one, so that both runs put the
same bytes on the wire."""
KEYS_OFF: Final = "keys-off"
KEYS_ON: Final = "keys-on"
LOG_OFF: Final = "log-off"
LOG_ON: Final = "log-on"
KEY_LIMITS: Final = {
    "requests_per_s": 1_000_000,
    "burst": 1_000_000,
    "max_in_flight": 100_000,
    "activations_per_hour": 1_000,
}
"""Every limit set, none ever reached: the keyed way pays for checking each."""


@dataclass(frozen=True)
class _Roles:
    """The two ways compared: ``base``, and ``measured``, whose added latency is judged."""

    base: str
    measured: str
    added_p50_ms: float
    added_p99_ms: float
    capacity_share: float | None
    """The least ``measured`` capacity as a share of ``base``'s, when judged."""
    added_by: str


PLAIN: Final = _Roles(DIRECT, ACTIVATOR, ADDED_P50_MS, ADDED_P99_MS, None, "the activator")
KEYED: Final = _Roles(KEYS_OFF, KEYS_ON, 0.05, 0.2, 0.9, "keys and quotas")
LOGGED: Final = _Roles(LOG_OFF, LOG_ON, 0.05, 0.2, 0.9, "the access log")
_ENV: Final = {
    ACTIVATOR: None,
    KEYS_OFF: None,
    KEYS_ON: {"ZEROSERVE_ACTIVATOR_AUTH": "keys"},
    LOG_OFF: {"ZEROSERVE_ACTIVATOR_ACCESS_LOG": "false"},
    LOG_ON: {"ZEROSERVE_ACTIVATOR_ACCESS_LOG": "true"},
}
"""What each way's platform is started with beyond the benchmark's defaults."""


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
    compare = parser.add_mutually_exclusive_group()
    compare.add_argument(
        "--keys", action="store_true", help="API keys and quotas on against off, two platforms"
    )
    compare.add_argument(
        "--access-log",
        action="store_true",
        help="the activator's access log on against off, two platforms (otherwise it is on)",
    )
    parser.add_argument(
        "--same",
        action="store_true",
        help="with --keys or --access-log: start the measured platform as the base one (an "
        "A/A run: what two identical platforms differ by, the noise floor of the comparison)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the platform instead")
    parser.add_argument("--profile-rate", type=float, default=400.0)
    parser.add_argument("--top", type=int, default=30, help="functions per profile ranking")
    args = parser.parse_args(argv)
    if args.same and not (args.keys or args.access_log):
        parser.error("--same needs --keys or --access-log")
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
class _Way:
    """One way to the model: the port, the platform and worker it goes through, and the
    headers it sends."""

    port: int
    platform: PlatformProcess
    worker_pid: int
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class _Setup:
    """The model and the two ways to reach it (``roles``)."""

    roles: _Roles
    model: str
    body: models.RequestBody
    ways: dict[str, _Way]

    @property
    def platform(self) -> PlatformProcess:
        """The platform of the measured way."""
        return self.ways[self.roles.measured].platform

    def target(self, path: str) -> Target:
        way = self.ways[path]
        return Target(HOST, way.port, f"/v2/models/{self.model}/infer", way.headers)


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
        roles = KEYED if args.keys else LOGGED if args.access_log else PLAIN
        with contextlib.ExitStack() as stack:
            platforms: dict[str, PlatformProcess] = {}
            paths = (ACTIVATOR,) if roles is PLAIN else (roles.base, roles.measured)
            for path in paths:
                platforms[path] = stack.enter_context(
                    PlatformProcess(
                        workdir,
                        cache_dir=workdir / ("cache" if path == ACTIVATOR else f"cache-{path}"),
                        allowed_storage=(str(workdir / "models"),),
                        env=_ENV[roles.base if args.same else path],
                        name="platform" if path == ACTIVATOR else f"platform-{path}",
                    )
                )
            setup = _start_model(roles, platforms, model, spec, model_dir, keyed=not args.same)
            if args.profile:
                return _profile(args, setup, stamp, tag)
            points, capacity = _measure(args, setup, loadgen)
            commands: dict[str, list[str]] = {
                "platform" if path == ACTIVATOR else f"platform {path}": platform.command
                for path, platform in platforms.items()
            }
            if isinstance(loadgen, WrkLoad):
                commands["capacity"] = loadgen.command(
                    setup.target(roles.measured),
                    setup.body,
                    connections=args.capacity_connections,
                    duration_s=args.capacity_duration,
                )
    gate_cost = None
    if args.keys and not args.same:
        # After the platforms stopped: the in-process figure is taken on a quieter machine.
        gate_cost = gate_cost_module.measure()
    activator_capacity = statistics.median(capacity[roles.measured])
    limit = SATURATION_SHARE * activator_capacity
    targets = _targets(roles, points, args.rate_list, limit, capacity)
    if gate_cost is not None:
        targets.append(
            report.Target(
                "in_process_added",
                "in process: keys and quotas add <= 0.05 ms of CPU per request",
                gate_cost["added_us"] / 1000,
                KEYED.added_p50_ms,
                is_max=True,
            )
        )
    print(_table(roles, points, args.rate_list, capacity, limit, spec, model))
    if gate_cost is not None:
        print("\n" + gate_cost_module.text(gate_cost))
    print(report.targets_text(targets))
    document: dict[str, Any] = {
        "benchmark": "activator",
        "started_utc": started_utc.isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - started, 1),
        "argv": sys.argv,
        "same": args.same,
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
            "paths": {"base": roles.base, "measured": roles.measured},
            "key_limits": KEY_LIMITS if args.keys else None,
            "order": "rates ascending on even repeats, descending on odd; at each rate both "
            f"paths back to back, {roles.base} first on even (rate index + repeat), else "
            f"{roles.measured}",
            "open_loop": "Poisson arrivals, latency from the intended send time "
            f"(zeroserve bench's open loop, in this process, at most {MAX_CONNECTIONS} "
            "connections)",
            "capacity": f"closed loop, {args.capacity_connections} connections, "
            f"{args.capacity_duration} s, {loadgen.name}",
            "below_saturation": f"rate <= {SATURATION_SHARE} x {roles.measured}'s median capacity",
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
        "added": _added_json(roles, points, args.rate_list),
        "in_process_cpu_per_request": gate_cost,
        "targets": [asdict(t) | {"passed": t.passed} for t in targets],
    }
    if not args.no_save:
        suffix = (
            ("-keys" if args.keys else "-log" if args.access_log else "")
            + ("-same" if args.same else "")
            + ("-quick" if args.quick else "")
        )
        saved = RESULTS_DIR / f"{stamp}-{tag}-activator{suffix}.json"
        report.write_json(saved, document)
        print(f"\nresults: {saved.relative_to(REPO_ROOT)} ({document['wall_s']:.0f} s)")
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
    roles: _Roles,
    platforms: dict[str, PlatformProcess],
    model: str,
    spec: models.MlpSpec,
    model_dir: Path,
    *,
    keyed: bool = True,
) -> _Setup:
    """Register the model with one replica on each platform, wait for it, and check every
    way's answers. Plain: the way through the activator and the way straight to its worker;
    with keys: each platform's activator, the keyed one with its key (when not ``keyed``, an
    A/A run, a key of the same shape that nothing checks)."""
    ways: dict[str, _Way] = {}
    for path, platform in platforms.items():
        platform.register(model, str(model_dir), {"min_replicas": 1, "max_replicas": 1})
        platform.load(model)
        [worker] = [w for w in platform.workers() if model in w["models"]]
        worker_pid = int(worker["details"]["pid"])
        headers: tuple[tuple[str, str], ...] = ()
        if path == KEYS_ON and keyed:
            key = {"name": "bench", "models": [model], "limits": KEY_LIMITS}
            created = platform.admin("POST", "/keys", key, expect=(201,))
            headers = (("Authorization", f"Bearer {created['key']}"),)
        elif path == KEYS_ON:
            # The A/A run sends the same bytes as the keyed one: a key of the same shape,
            # which a platform with keys off reads past.
            headers = (("Authorization", f"Bearer {_UNCHECKED_KEY}"),)
        ways[path] = _Way(platform.port, platform, worker_pid, headers)
        if path == ACTIVATOR:
            worker_port = int(str(worker["url"]).rsplit(":", 1)[1])
            ways[DIRECT] = _Way(worker_port, platform, worker_pid)
    body = models.request_body(spec, models.sample_rows(spec, 1), "binary")
    setup = _Setup(roles, model, body, ways)
    row = models.sample_rows(spec, 1)
    expected = engine_module.Engine(model_dir / "1" / "model.onnx").run(row)
    for path, way in ways.items():
        served = infer_once(way.port, model, body, extra_headers=dict(way.headers))
        if served.shape != expected.shape or not np.allclose(served, expected, 1e-3, 1e-4):
            raise RuntimeError(f"{path}: the answer differs from ONNX Runtime's")
    print(f"verified: {model} answers ONNX Runtime's output {' and '.join(ways)}")
    return setup


def _measure(
    args: argparse.Namespace, setup: _Setup, loadgen: LoadGenerator
) -> tuple[list[_Point], dict[str, list[float]]]:
    roles = setup.roles
    both = (roles.base, roles.measured)
    points = {(r, p): _Point(r, p) for r in args.rate_list for p in both}
    capacity: dict[str, list[float]] = {roles.base: [], roles.measured: []}
    per_repeat = 2 * (args.capacity_duration + 1) + len(points) * (args.duration + args.warmup)
    print(
        f"{len(points)} points x {args.repeats} repeats, ~{args.repeats * per_repeat / 60:.1f} "
        f"min; open loop in this process, capacity: {loadgen.name}",
        flush=True,
    )
    for repeat in range(args.repeats):
        order = both if repeat % 2 == 0 else both[::-1]
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
            first = both if (index + repeat) % 2 == 0 else both[::-1]
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
    return list(points.values()), capacity


def _run_point(
    args: argparse.Namespace, setup: _Setup, path: str, rate: float, seed: int
) -> dict[str, Any]:
    way = setup.ways[path]
    platform_cpu = way.platform.cpu_seconds()
    worker_cpu = process_cpu_seconds(way.worker_pid)
    busy = machine.busy_cpu_seconds()
    started = time.perf_counter()
    result = _open_loop(
        setup, path, rate, duration_s=args.duration, warmup_s=args.warmup, seed=seed
    )
    wall = time.perf_counter() - started
    platform_cpu = (way.platform.cpu_seconds() - platform_cpu) / wall
    worker_cpu = (process_cpu_seconds(way.worker_pid) - worker_cpu) / wall
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


def _added(roles: _Roles, points: list[_Point], rate: float, key: str) -> float:
    """Median of the measured way minus median of the base way."""
    measured = _find(points, rate, roles.measured).median(key)
    return measured - _find(points, rate, roles.base).median(key)


def _paired_added(roles: _Roles, points: list[_Point], rate: float, key: str) -> float:
    """Median over repeats of (measured - base), each pair measured back to back."""
    pairs = zip(
        _find(points, rate, roles.measured).repeats,
        _find(points, rate, roles.base).repeats,
        strict=True,
    )
    return statistics.median(float(a[key]) - float(d[key]) for a, d in pairs)


def _added_json(roles: _Roles, points: list[_Point], rates: list[float]) -> list[dict[str, Any]]:
    keys = ("p50_ms", "p99_ms")
    return [
        {
            "rate": rate,
            **{f"{k}_diff_of_medians": _added(roles, points, rate, k) for k in keys},
            **{f"{k}_median_of_pairs": _paired_added(roles, points, rate, k) for k in keys},
            "platform_cpu_ms_per_request": _cpu_per_request(roles, points, rate),
        }
        for rate in rates
    ]


def _cpu_per_request(roles: _Roles, points: list[_Point], rate: float) -> float:
    """The measured way's platform CPU per request, less the base way's: through the
    activator less its idle CPU (plain), or with keys less without (keys)."""
    through = _find(points, rate, roles.measured)
    idle = _find(points, rate, roles.base).median("platform_cpu_cores")
    return (through.median("platform_cpu_cores") - idle) / through.median("throughput") * 1e3


def _targets(
    roles: _Roles,
    points: list[_Point],
    rates: list[float],
    limit: float,
    capacity: dict[str, list[float]],
) -> list[report.Target]:
    targets: list[report.Target] = []
    for rate in rates:
        if rate > limit:
            continue
        for key, threshold in (("p50_ms", roles.added_p50_ms), ("p99_ms", roles.added_p99_ms)):
            name = key.removesuffix("_ms")
            targets.append(
                report.Target(
                    f"added_{name}_at_{rate:g}_per_s",
                    f"{rate:g}/s: {roles.added_by} add <= {threshold:g} ms at {name}",
                    _added(roles, points, rate, key),
                    threshold,
                    is_max=True,
                )
            )
    if roles.capacity_share is not None:
        share = statistics.median(capacity[roles.measured]) / statistics.median(
            capacity[roles.base]
        )
        targets.append(
            report.Target(
                "capacity_share",
                f"capacity with {roles.added_by} >= {roles.capacity_share:g} x without",
                share,
                roles.capacity_share,
                is_max=False,
            )
        )
    return targets


def _table(
    roles: _Roles,
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
        for path in (roles.base, roles.measured):
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
            f"{'':>7} {'added':<10}{'':>8}{_added(roles, points, rate, 'p50_ms'):>+8.3f}"
            f"{_added(roles, points, rate, 'p90_ms'):>+8.3f}"
            f"{_added(roles, points, rate, 'p99_ms'):>+8.3f}"
            f"   platform CPU {_cpu_per_request(roles, points, rate):.3f} ms/request{mark}"
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
        f"capacity (closed loop): {roles.base} {cap[roles.base]:.0f}/s, {roles.measured} "
        f"{cap[roles.measured]:.0f}/s; judged below saturation: rates <= {limit:.0f}/s",
        "",
        "p50/p90/p99: from the intended send time to the answer's last byte; svc p50: from the "
        "actual send; lag p99: actual - intended send (the client's own delay); cpu: cores used "
        "by the platform process (control plane + activator), the worker, this client; other: "
        f"the rest of the machine (noise); added: {roles.measured} median - {roles.base} "
        "median.",
    ]
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
        _open_loop(setup, setup.roles.measured, args.profile_rate, duration_s=2, warmup_s=0, seed=1)
        pid = setup.platform.pid
        command = profiling.pyspy_command(pid, raw, duration, native=False)
        spy = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            before = profiling.thread_cpu_seconds(pid)
            result = _open_loop(
                setup,
                setup.roles.measured,
                args.profile_rate,
                duration_s=duration,
                warmup_s=0,
                seed=2,
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
