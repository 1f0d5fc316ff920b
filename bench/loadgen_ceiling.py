"""How much load ``zeroserve bench`` can generate, against ``wrk`` on the same endpoints.

A load generator is only trustworthy while it is not the bottleneck, so this measures its own
cost. Two endpoints, each its own process pinned to CPU 0 (``taskset``), the client pinned to
CPU 1 so the two never share a core:

* ``trivial``: ``bench/trivial_server.py``, a uvloop + httptools server answering every POST
  with the same pre-built V2 answer (no model, nothing computed): the cheapest HTTP server
  Python offers, so that the client's share of the work is as large as it gets;
* ``serve``: ``python -m data_plane`` (what ``zeroserve serve`` runs) with a tiny ONNX MLP
  (16->32->8), a realistic small endpoint.

Both clients run closed loops of batch-1 JSON requests at each concurrency: ``zeroserve
bench`` (its own process, uvloop) and ``wrk -t1`` (``bench/loadgen.py``). For each the
client's CPU per request is measured (``zeroserve bench`` reports its own; wrk's comes from
the child's rusage); one core's worth of that is the client's **ceiling**, what it could
drive if the server were free. The served rate itself is usually the server's limit (its
CPU is shown). Repeats alternate the clients; medians are reported. Results go to
``bench/results/<UTC time>-<tag>-loadgen_ceiling.json``.

    python bench/loadgen_ceiling.py            # about 4 minutes
    python bench/loadgen_ceiling.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import machine, models, report
from bench.loadgen import Target, WrkLoad
from bench.server import HOST, REPO_ROOT, ServerProcess, free_port

RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
SERVER_CPU: Final = "0"
CLIENT_CPU: Final = "1"
TINY: Final = models.MlpSpec("tiny", (16, 32, 8))
TRIVIAL_INPUT: Final = models.MlpSpec("trivial", (4, 1))
"""The trivial server's metadata: one FP32 [-1, 4] input."""


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--duration", type=int, default=5, help="timed seconds per point")
    parser.add_argument("--warmup", type=int, default=1, help="untimed seconds per point")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--targets", default="trivial,serve", help="trivial, serve")
    parser.add_argument("--no-pin", action="store_true", help="do not pin with taskset")
    parser.add_argument("--quick", action="store_true", help="1 s points, 1 repeat, c=64")
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.repeats, args.concurrency = 1, 1, 1, "64"
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if not WrkLoad.is_available():
        raise SystemExit("wrk not found: apt-get install -y wrk")
    started = time.monotonic()
    started_utc = datetime.now(UTC)
    concurrencies = [int(x) for x in args.concurrency.split(",") if x.strip()]
    targets = [x.strip() for x in args.targets.split(",") if x.strip()]
    server_pin = None if args.no_pin else SERVER_CPU
    client_pin = None if args.no_pin else CLIENT_CPU
    points: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    commands: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="zeroserve-ceiling-") as tmp:
        workdir = Path(tmp)
        wrk = WrkLoad(workdir, pin_cpus=client_pin)
        for target in targets:
            server, model, spec = _server(target, workdir, server_pin)
            commands[f"{target} server"] = server.command
            with server:
                body = models.request_body(spec, models.sample_rows(spec, 1), "json")
                for repeat in range(args.repeats):
                    for c in concurrencies:
                        clients = ("zeroserve bench", "wrk")
                        for client in clients if (repeat + c) % 2 == 0 else clients[::-1]:
                            if client == "wrk":
                                record, command = _wrk(wrk, server, model, body, c, args)
                            else:
                                record, command = _ours(server, model, c, args, client_pin)
                            commands[f"{client} c={c}"] = command
                            points.setdefault((target, client, c), []).append(record)
                            print(
                                f"[{repeat + 1}/{args.repeats}] {target:<8} {client:<16} "
                                f"c={c:<3} {record['throughput']:9,.0f}/s  client "
                                f"{record['client_cpu_cores']:.2f} cores, "
                                f"{record['client_cpu_us_per_request']:.1f} us/req; server "
                                f"{record['server_cpu_cores']:.2f} cores",
                                file=sys.stderr,
                                flush=True,
                            )
    table = _table(points, args.repeats)
    print(table)
    document = {
        "benchmark": "loadgen_ceiling",
        "started_utc": started_utc.isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - started, 1),
        "argv": sys.argv,
        "machine": machine.describe(REPO_ROOT, load_generator="zeroserve bench and wrk"),
        "settings": {
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "repeats": args.repeats,
            "pinning": None if args.no_pin else {"server": SERVER_CPU, "client": CLIENT_CPU},
            "request": "batch-1 JSON infer, keep-alive, closed loop",
            "commands": commands,
        },
        "points": [
            {
                "target": target,
                "client": client,
                "concurrency": c,
                "median": {k: report.median_of(runs, k) for k in _KEYS},
                "repeats": runs,
            }
            for (target, client, c), runs in points.items()
        ],
    }
    if not args.no_save:
        stamp = started_utc.strftime("%Y-%m-%dT%H%M%SZ")
        tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", args.tag or socket.gethostname()).strip("-")
        suffix = "-quick" if args.quick else ""
        path = RESULTS_DIR / f"{stamp}-{tag or 'host'}-loadgen_ceiling{suffix}.json"
        report.write_json(path, document)
        print(f"\nresults: {path.relative_to(REPO_ROOT)}")
    return 0


def _server(
    target: str, workdir: Path, pin: str | None
) -> tuple[ServerProcess, str, models.MlpSpec]:
    port = free_port()
    if target == "trivial":
        command = [sys.executable, str(REPO_ROOT / "bench" / "trivial_server.py")]
        command += ["--port", str(port)]
        return (
            ServerProcess(command, port, workdir / "trivial.log", pin_cpus=pin),
            "trivial",
            (TRIVIAL_INPUT),
        )
    if target == "serve":
        repository = workdir / "models"
        models.write_repository(repository, [TINY], max_queue_delay_us=0)
        command = [sys.executable, "-m", "data_plane", "--model-repository", str(repository)]
        command += ["--http-port", str(port), "--log-level", "warning", "--metrics-port", "0"]
        return ServerProcess(command, port, workdir / "serve.log", pin_cpus=pin), TINY.name, TINY
    raise SystemExit(f"unknown target {target!r}: trivial or serve")


def _ours(
    server: ServerProcess, model: str, c: int, args: argparse.Namespace, pin: str | None
) -> tuple[dict[str, Any], list[str]]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, "-m", "zeroserve.cli", "bench", f"http://{HOST}:{server.port}"]
        command += ["--model", model, "--concurrency", str(c), "--duration", f"{args.duration}s"]
        command += ["--warmup", f"{args.warmup}s", "--progress", "none", "--json", out.name]
        if pin:
            command = ["taskset", "-c", pin, *command]
        cpu = server.cpu_seconds()
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
        cpu = server.cpu_seconds() - cpu
        if done.returncode != 0:
            raise RuntimeError(f"zeroserve bench failed: {done.stderr[-1000:]}")
        [level] = json.loads(Path(out.name).read_text(encoding="utf-8"))["levels"]
    return {
        "throughput": level["throughput"],
        "p50_ms": level["latency"]["p50_ms"],
        "p99_ms": level["latency"]["p99_ms"],
        "errors": level["error_count"],
        "client_cpu_cores": level["client_cpu_cores"],
        "client_cpu_us_per_request": level["client_cpu_us_per_request"],
        # Over warm-up and window (the same load); the subprocess's start is idle time.
        "server_cpu_cores": cpu / (args.duration + args.warmup),
    }, command


def _wrk(
    wrk: WrkLoad,
    server: ServerProcess,
    model: str,
    body: models.RequestBody,
    c: int,
    args: argparse.Namespace,
) -> tuple[dict[str, Any], list[str]]:
    target = Target(HOST, server.port, f"/v2/models/{model}/infer")
    if args.warmup:
        wrk.run(target, body, connections=c, duration_s=args.warmup)
    cpu = server.cpu_seconds()
    result = wrk.run(target, body, connections=c, duration_s=args.duration)
    cpu = server.cpu_seconds() - cpu
    answered = result.requests + result.error_count
    record = asdict(result) | {
        "errors": result.error_count,
        "client_cpu_us_per_request": result.client_cpu_cores * result.duration_s / answered * 1e6
        if answered
        else None,
        "server_cpu_cores": cpu / result.duration_s,
    }
    return record, wrk.command(target, body, connections=c, duration_s=args.duration)


_KEYS: Final = (
    "throughput",
    "p50_ms",
    "p99_ms",
    "client_cpu_cores",
    "client_cpu_us_per_request",
    "server_cpu_cores",
)


def _table(points: dict[tuple[str, str, int], list[dict[str, Any]]], repeats: int) -> str:
    header = (
        f"{'target':<9}{'client':<17}{'c':>4}{'req/s':>10}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'cli cores':>10}{'cli us/req':>11}{'ceiling/s':>11}{'srv cores':>10}"
    )
    lines = ["", header, "-" * len(header)]
    for (target, client, c), runs in points.items():
        us = report.median_of(runs, "client_cpu_us_per_request")
        lines.append(
            f"{target:<9}{client:<17}{c:>4}{report.median_of(runs, 'throughput'):>10,.0f}"
            f"{report.median_of(runs, 'p50_ms'):>8.2f}{report.median_of(runs, 'p99_ms'):>8.2f}"
            f"{report.median_of(runs, 'client_cpu_cores'):>10.2f}{us:>11.1f}{1e6 / us:>11,.0f}"
            f"{report.median_of(runs, 'server_cpu_cores'):>10.2f}"
        )
    lines += [
        "",
        f"Medians of {repeats} repeat(s). cli us/req: the client's CPU per request; ceiling/s: "
        "one core divided by that, what the client could drive if the server kept up; "
        "srv cores: the server's CPU (1.00 = its core is full, so req/s is the server's limit).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
