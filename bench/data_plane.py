"""Data-plane benchmark: the ONNX Runtime engine alone against the server in front of it.

One run on one machine, for two generated MLPs (light 256->1024->1024->1024->10, heavy
1024->4096->4096->4096->1000): the engine alone (``InferenceSession.run`` at batch 1, 8, 32,
in this process, with the server's session options) and the server (a ``python -m
data_plane`` subprocess on loopback, dynamic batching up to 32) under closed-loop
concurrency 1, 8, 32, 64 of batch-1 requests, JSON and binary. Every configuration is checked
once (status 200, output shape and values against the engine) before it is timed; repeats
visit all configurations in turn (reversed on odd repeats) so drift spreads across them, and
medians are reported. Results go to ``bench/results/<UTC time>-<tag>-data_plane.json``.

    python bench/data_plane.py                 # full run (about 14 minutes)
    python bench/data_plane.py --quick         # smoke run, under a minute
    python bench/data_plane.py --profile       # where the server's time goes (light, c=64, binary)
"""

from __future__ import annotations

import argparse
import re
import resource
import signal
import socket
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Run as a script, sys.path[0] is bench/; the repository root must come first so that
# `bench` is a package and `data_plane` names the server, not this file.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench import engine as engine_module, machine, models, profiling, report
from bench.loadgen import BenchLoad, LoadGenerator, Target, WrkLoad
from bench.server import (
    HOST,
    REPO_ROOT,
    ServerProcess,
    free_port,
    infer_once,
    model_counts,
    server_command,
)

RESULTS_DIR = REPO_ROOT / "bench" / "results"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--duration", type=int, default=10, help="timed seconds per point")
    parser.add_argument("--warmup", type=int, default=2, help="untimed seconds before each point")
    parser.add_argument("--repeats", type=int, default=3, help="passes over all points; medians")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 s points, 1 repeat, fewer points"
    )
    parser.add_argument("--models", default="light,heavy", help="comma-separated: light, heavy")
    parser.add_argument("--batches", default="1,8,32", help="engine-alone batch sizes")
    parser.add_argument("--concurrency", default="1,8,32,64", help="server connections")
    parser.add_argument("--encodings", default="json,binary", help="json, binary")
    parser.add_argument(
        "--max-queue-delay-us",
        type=int,
        default=0,
        help="dynamic_batching max_queue_delay_microseconds in the generated configs",
    )
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        help="intra_op_thread_count config parameter, also used by the engine alone "
        "(default: the server's default, 0 = ONNX Runtime chooses)",
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=1,
        help="instance_group count in the generated configs; the engine alone then runs as "
        "many batches at once from as many threads",
    )
    parser.add_argument(
        "--client",
        choices=["auto", "wrk", "zeroserve-bench"],
        default="auto",
        help="closed-loop load: wrk, or zeroserve bench's loop in this process (auto: wrk "
        "where it is installed)",
    )
    parser.add_argument("--pin-client", metavar="CPUS", help="taskset CPU list for wrk")
    parser.add_argument("--pin-server", metavar="CPUS", help="taskset CPU list for the server")
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    parser.add_argument("--profile", action="store_true", help="profile the server instead")
    parser.add_argument("--profile-method", choices=["auto", "py-spy", "cprofile"], default="auto")
    parser.add_argument("--profile-model", default="light")
    parser.add_argument("--profile-encoding", default="binary")
    parser.add_argument("--profile-concurrency", type=int, default=64)
    parser.add_argument("--profile-native", action="store_true", help="py-spy --native")
    parser.add_argument("--top", type=int, default=30, help="functions per profile ranking")
    parser.add_argument(
        "--keep-raw",
        action="store_true",
        help="also save py-spy's raw collapsed stacks (flamegraph.pl input) under bench/results",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.repeats = 2, 1, 1
        args.batches, args.concurrency = "1,32", "1,64"
    if args.duration < 1 or args.warmup < 0 or args.repeats < 1:
        parser.error("--duration must be >= 1 s, --warmup >= 0 s, --repeats >= 1")
    return args


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _loadgen(args: argparse.Namespace, workdir: Path) -> LoadGenerator:
    if args.client == "zeroserve-bench" or (args.client == "auto" and not WrkLoad.is_available()):
        if args.client == "auto":
            print(
                "wrk not found (apt-get install -y wrk); using zeroserve bench's loop",
                file=sys.stderr,
            )
        return BenchLoad()
    if not WrkLoad.is_available():
        raise SystemExit("wrk not found; apt-get install -y wrk, or --client zeroserve-bench")
    return WrkLoad(workdir, pin_cpus=args.pin_client)


def _stamp_and_tag(args: argparse.Namespace) -> tuple[str, str]:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", args.tag or socket.gethostname()).strip("-") or "host"
    return stamp, tag


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    specs = [models.MODELS[name] for name in _names(args.models)]
    encodings = _names(args.encodings)
    started = time.monotonic()
    started_utc = datetime.now(UTC).isoformat(timespec="seconds")
    stamp, tag = _stamp_and_tag(args)
    with tempfile.TemporaryDirectory(prefix="zeroserve-bench-") as tmp:
        workdir = Path(tmp)
        repository = workdir / "models"
        models.write_repository(
            repository,
            specs,
            max_queue_delay_us=args.max_queue_delay_us,
            intra_op_threads=args.intra_op_threads,
            instances=args.instances,
        )
        print(f"generated {', '.join(s.name for s in specs)} in {time.monotonic() - started:.1f} s")
        loadgen = _loadgen(args, workdir)
        if args.profile:
            return _profile(args, repository, loadgen, workdir, stamp, tag)
        points, commands = _measure(args, specs, encodings, repository, loadgen, workdir)
    titles = {
        s.name: f"{s.name} MLP ({s.description}, {s.parameter_count / 1e6:.1f} M parameters)"
        for s in specs
    }
    targets = report.evaluate_targets(points)
    print(report.table(points, titles))
    print(report.targets_text(targets))
    document: dict[str, Any] = {
        "benchmark": "data_plane",
        "started_utc": started_utc,
        "wall_s": round(time.monotonic() - started, 1),
        "argv": sys.argv,
        "quick": args.quick,
        "machine": machine.describe(REPO_ROOT, load_generator=loadgen.name),
        "settings": {
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "repeats": args.repeats,
            "order": "every repeat visits every point; odd repeats in reverse",
            "load_generator": loadgen.name,
            "pin_client": args.pin_client,
            "pin_server": args.pin_server,
            "max_queue_delay_us": args.max_queue_delay_us,
            "engine_session": {
                "providers": engine_module.PROVIDERS,
                "intra_op_num_threads": engine_module.INTRA_OP_THREADS
                if args.intra_op_threads is None
                else args.intra_op_threads,
                "inter_op_num_threads": engine_module.INTER_OP_THREADS,
                "concurrent_callers": args.instances,
                "note": "the server's defaults (runtimes/onnx/builder.py); 0: ONNX Runtime chooses",
            },
            "commands": commands,
        },
        "models": {
            s.name: {
                "widths": list(s.widths),
                "parameters": s.parameter_count,
                "config_pbtxt": models.config_text(
                    s,
                    max_queue_delay_us=args.max_queue_delay_us,
                    intra_op_threads=args.intra_op_threads,
                    instances=args.instances,
                ),
            }
            for s in specs
        },
        "points": report.points_json(points),
        "targets": [asdict(t) | {"passed": t.passed} for t in targets],
    }
    if not args.no_save:
        suffix = "-quick" if args.quick else ""
        path = RESULTS_DIR / f"{stamp}-{tag}-data_plane{suffix}.json"
        report.write_json(path, document)
        print(f"\nresults: {path.relative_to(REPO_ROOT)} ({document['wall_s']:.0f} s)")
    return 0


def _measure(
    args: argparse.Namespace,
    specs: list[models.MlpSpec],
    encodings: list[str],
    repository: Path,
    loadgen: LoadGenerator,
    workdir: Path,
) -> tuple[list[report.Point], dict[str, Any]]:
    """Check every configuration once, then time every point ``args.repeats`` times."""
    engines = {
        s.name: engine_module.Engine(
            repository / s.name / "1" / "model.onnx", intra_op_threads=args.intra_op_threads
        )
        for s in specs
    }
    rows = {s.name: models.sample_rows(s, models.MAX_BATCH_SIZE) for s in specs}
    bodies = {
        (s.name, e): models.request_body(s, rows[s.name][:1], e) for s in specs for e in encodings
    }
    points: list[report.Point] = []
    for s in specs:
        points += [report.Point(s.name, report.ENGINE, None, b) for b in _ints(args.batches)]
        points += [
            report.Point(s.name, report.SERVER, e, c)
            for e in encodings
            for c in _ints(args.concurrency)
        ]
    port = free_port()
    command = server_command(repository, port, [s.name for s in specs])
    server = ServerProcess(command, port, workdir / "server.log", pin_cpus=args.pin_server)
    commands: dict[str, Any] = {"server": server.command}
    per_point = args.duration + args.warmup
    print(
        f"{len(points)} points x {args.repeats} repeats x ~{per_point} s = "
        f"~{len(points) * args.repeats * per_point / 60:.1f} min; client: {loadgen.name}"
    )
    with server:
        for (name, encoding), body in bodies.items():
            _verify(port, engines[name], rows[name][:1], name, body)
            if isinstance(loadgen, WrkLoad):
                commands[f"wrk {name} {encoding}"] = loadgen.command(
                    _target(port, name), body, connections=64, duration_s=args.duration
                )
        print("verified: every model and encoding answers 200 with the engine's output")
        for repeat in range(args.repeats):
            order = points if repeat % 2 == 0 else points[::-1]
            for point in order:
                if point.kind == report.ENGINE:
                    result = engines[point.model].measure(
                        rows[point.model][: point.size],
                        duration_s=args.duration,
                        warmup_s=args.warmup,
                        callers=args.instances,
                    )
                    record: dict[str, Any] = asdict(result)
                else:
                    assert point.encoding is not None
                    record = _serve(
                        args, server, loadgen, point, bodies[(point.model, point.encoding)]
                    )
                point.repeats.append(record)
                print(
                    f"[{repeat + 1}/{args.repeats}] {point.model:<5} {point.label:<22} "
                    f"{record['throughput']:9.1f}/s  p50 {record['p50_ms']:7.2f} ms  "
                    f"p99 {record['p99_ms']:7.2f} ms",
                    file=sys.stderr,
                    flush=True,
                )
        # uvicorn re-raises the SIGTERM it handled once it has shut down gracefully.
        if server.stop() not in (0, -signal.SIGTERM, None):
            print(f"server exited with an error:\n{server.log_tail()}", file=sys.stderr)
    return points, commands


def _serve(
    args: argparse.Namespace,
    server: ServerProcess,
    loadgen: LoadGenerator,
    point: report.Point,
    body: models.RequestBody,
) -> dict[str, Any]:
    target = _target(server.port, point.model)
    if args.warmup > 0:
        loadgen.run(target, body, connections=point.size, duration_s=args.warmup)
    counts = model_counts(server.port, point.model)
    own = resource.getrusage(resource.RUSAGE_SELF)
    cpu, busy = server.cpu_seconds(), machine.busy_cpu_seconds()
    result = loadgen.run(target, body, connections=point.size, duration_s=args.duration)
    cpu, busy = server.cpu_seconds() - cpu, machine.busy_cpu_seconds() - busy
    own_after = resource.getrusage(resource.RUSAGE_SELF)
    # Accounted for: the server, this process (zeroserve bench's loop runs in it) and
    # wrk (a child, measured by the load generator). The rest of the machine is noise.
    own_s = own_after.ru_utime - own.ru_utime + own_after.ru_stime - own.ru_stime
    wrk_s = result.client_cpu_cores * result.duration_s if isinstance(loadgen, WrkLoad) else 0.0
    accounted = cpu + own_s + wrk_s
    after = model_counts(server.port, point.model)
    executions = after.execution_count - counts.execution_count
    inferences = after.inference_count - counts.inference_count
    return asdict(result) | {
        "error_count": result.error_count,
        "server_cpu_cores": cpu / result.duration_s,
        "other_cpu_cores": max(busy - accounted, 0.0) / result.duration_s,
        "server_inferences": inferences,
        "server_executions": executions,
        "avg_batch": inferences / executions if executions else None,
    }


def _verify(
    port: int, engine: engine_module.Engine, row: np.ndarray, name: str, body: models.RequestBody
) -> None:
    expected = engine.run(row)
    served = infer_once(port, name, body)
    if served.shape != expected.shape:
        raise RuntimeError(
            f"{name} {body.encoding}: output shape {served.shape}, expected {expected.shape}"
        )
    if not np.allclose(served, expected, rtol=1e-3, atol=1e-4):
        worst = float(np.max(np.abs(served - expected)))
        raise RuntimeError(f"{name} {body.encoding}: output differs from the engine's by {worst:g}")


def _target(port: int, model: str) -> Target:
    return Target(HOST, port, f"/v2/models/{model}/infer")


def _profile(
    args: argparse.Namespace,
    repository: Path,
    loadgen: LoadGenerator,
    workdir: Path,
    stamp: str,
    tag: str,
) -> int:
    spec = models.MODELS[args.profile_model]
    body = models.request_body(spec, models.sample_rows(spec, 1), args.profile_encoding)
    run = profiling.ProfileRun(
        repository=repository,
        model=spec.name,
        body=body,
        loadgen=loadgen,
        concurrency=args.profile_concurrency,
        duration_s=args.duration,
        warmup_s=args.warmup,
        workdir=workdir,
        method=args.profile_method,
        native=args.profile_native,
        top=args.top,
    )
    outcome = profiling.profile(run, REPO_ROOT)
    description = machine.describe(REPO_ROOT, load_generator=loadgen.name)
    header = [
        f"zeroserve data-plane profile, {stamp}",
        f"machine: {description['cpu_model']}, {description['cpus_usable']} CPUs, "
        f"{description['memory_gib']} GiB, {description['os']}, Python {description['python']}, "
        f"onnxruntime {description['packages']['onnxruntime']}",
        f"git: {description['git']['commit']} (dirty: {description['git']['dirty']})",
        "commands:",
        *(f"  {' '.join(c)}" for c in outcome.commands),
    ]
    text = "\n".join(header) + "\n\n" + outcome.text + "\n"
    print(text)
    if not args.no_save:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{stamp}-{tag}-data_plane-profile.txt"
        path.write_text(text, encoding="utf-8")
        print(f"profile: {path.relative_to(REPO_ROOT)}")
        if outcome.raw_path is not None and args.keep_raw:
            raw = path.with_name(path.stem + "-pyspy-raw.txt")
            raw.write_bytes(outcome.raw_path.read_bytes())
            print(f"raw stacks (flamegraph.pl input): {raw.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
