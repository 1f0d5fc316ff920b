"""zeroserve against real Triton 2.51 as Triton users measure servers: with Triton's own
``perf_analyzer`` 2.51 (:mod:`bench.perf_analyzer`), over HTTP and gRPC.

The model is :mod:`bench.python_backend`'s light MLP (ONNX Runtime inside ``model.py``):

(a) ``zeroserve_triton``: Triton's contract, in a zeroserve stub process;
(b) ``zeroserve_inprocess``: zeroserve's dict contract, in the server's process;
(c) ``zeroserve_onnx``: the same ONNX file on zeroserve's native ONNX Runtime path;
(d) ``triton``: the same ``model.py`` as (a) in Triton 2.51's Python backend.

Batch-1 requests (perf_analyzer's binary tensors over HTTP), sync mode unless ``--async``;
for each repeat, variant (protocol; tensors in the requests or in system shared memory) and
concurrency the contenders run one after the other in an
order rotated by the repeat, so that drifting machine load hits each the same; the tables
give the medians of the repeats, with the load average beside each point.

    python -m bench.perf_analyzer_compare --repeats 3 \
        --output bench/results/<UTC>-vm-perf_analyzer.json
    python -m bench.perf_analyzer_compare --quick   # one short round: the script works
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final, Literal

from bench import profiling
from bench.perf_analyzer import (
    PerfAnalyzerError,
    PerfAnalyzerInstall,
    PerfPoint,
    Protocol,
    perf_analyzer_install,
    run_settled_point,
)
from bench.python_backend import (
    MAX_BATCH_SIZE,
    SPEC,
    add_run_arguments,
    contenders,
    cpu_seconds,
    has_triton,
    onnxruntime_for_triton,
    write_output,
)
from bench.server import REPO_ROOT, free_port

CONTENDERS: Final = ("zeroserve_triton", "zeroserve_inprocess", "zeroserve_onnx", "triton")
MODELS: Final = {
    "zeroserve_triton": "mlp_triton",
    "zeroserve_inprocess": "mlp_inprocess",
    "zeroserve_onnx": "mlp_onnx",
    "triton": "mlp_triton",
}
VARIANTS: Final[dict[str, tuple[Protocol, Literal["none", "system"]]]] = {
    "http": ("http", "none"),
    "grpc": ("grpc", "none"),
    "http-shm": ("http", "system"),
    "grpc-shm": ("grpc", "system"),
}
"""What a table row measures: the protocol, and whether tensors travel in system shared
memory (perf_analyzer's ``--shared-memory system``) or in the requests."""


@dataclass(frozen=True)
class ComparePoint:
    contender: str
    variant: str
    concurrency: int
    repeat: int
    infer_per_s: float
    p50_us: float
    p99_us: float
    load_average: float
    stability_percentage: float = 0.0
    """How far perf_analyzer's windows were allowed to differ for this point."""


def write_onnx_model(repository: Path) -> None:
    """``mlp_onnx``: the ONNX file of ``mlp_triton`` on zeroserve's ONNX Runtime path."""
    folder = repository / "mlp_onnx"
    (folder / "1").mkdir(parents=True)
    shutil.copy(repository / "mlp_triton" / "1" / "model.onnx", folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(
        f'name: "mlp_onnx"\nbackend: "onnxruntime"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {SPEC.input_size} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {SPEC.output_size} ] }} ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\ndynamic_batching { }\n"
    )


def _measure(
    install: PerfAnalyzerInstall,
    args: argparse.Namespace,
    *,
    model: str,
    url: str,
    protocol: Protocol,
    concurrency: int,
    shared_memory: Literal["none", "system"],
) -> tuple[PerfPoint, float]:
    """One point, and the stability percentage it settled at."""
    return run_settled_point(
        install,
        stability_percentage=args.stability_percentage,
        max_trials=args.max_trials,
        model=model,
        url=url,
        protocol=protocol,
        concurrency=concurrency,
        measurement_interval_ms=args.interval_ms,
        request_count=args.request_count,
        is_async=args.is_async,
        shared_memory=shared_memory,
    )


def _profile(
    install: PerfAnalyzerInstall,
    args: argparse.Namespace,
    pids: dict[str, int],
    urls: dict[str, str],
    folder: Path,
) -> str:
    """The server CPU per inference of ``args.profile`` and of Triton on one point
    (process and children: stub processes count), and py-spy's rankings of zeroserve's
    process during its run."""
    protocol, shared_memory = VARIANTS[args.variants[0]]
    concurrency = args.concurrency[0]
    lines = [
        f"{args.variants[0]}, c={concurrency}, {'async' if args.is_async else 'sync'}, "
        f"perf_analyzer {args.interval_ms} ms windows; load average {os.getloadavg()[0]:.2f}",
        "",
        "server CPU during the point (the server's process, and its children):",
    ]
    folded = None
    for key in (args.profile, "triton"):
        server = "triton" if key == "triton" else "zeroserve"
        spy = None
        raw = folder / "pyspy-raw.txt"
        if server == "zeroserve" and profiling.pyspy_available():
            # Longer than any point: stopped once the point ends.
            command = profiling.pyspy_command(pids[server], raw, 600, native=False)
            spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            time.sleep(1.0)  # py-spy attached before the load starts
        try:
            own, children = cpu_seconds(pids[server])
            started = time.perf_counter()
            point, stability = _measure(
                install,
                args,
                model=MODELS[key],
                url=urls[server],
                protocol=protocol,
                concurrency=concurrency,
                shared_memory=shared_memory,
            )
            wall = time.perf_counter() - started
            own_after, children_after = cpu_seconds(pids[server])
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
                try:
                    spy.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    spy.kill()
                    spy.wait()
        cores = (own_after - own + children_after - children) / wall
        lines.append(
            f"  {key:<20} {point.infer_per_s:8.0f} infer/s  p50 {point.p50_us / 1000:.2f} ms  "
            f"{cores:.2f} cores ({(children_after - children) / wall:.2f} in children)  "
            f"~{cores / max(point.infer_per_s, 1.0) * 1e6:.0f} us CPU per inference "
            f"(stable within {stability:g} %)"
        )
        if spy is not None and raw.is_file() and raw.stat().st_size:
            folded = profiling.fold_pyspy(raw, REPO_ROOT)
    if folded is not None:
        lines += ["", f"py-spy, zeroserve's process ({args.profile}):", ""]
        lines.append(profiling.pyspy_text(folded, top=args.top))
    return "\n".join(lines)


def rotated(items: Sequence[str], by: int) -> list[str]:
    """``items`` starting at index ``by`` (modulo its length)."""
    shift = by % len(items)
    return [*items[shift:], *items[:shift]]


def run(args: argparse.Namespace) -> tuple[list[ComparePoint], list[str]]:
    """Every point measured, and what perf_analyzer said of those that could not be."""
    install = perf_analyzer_install()
    if isinstance(install, str):
        raise SystemExit(f"perf_analyzer cannot run here: {install}")
    with tempfile.TemporaryDirectory(prefix="zeroserve-bench-pa-") as tmp:
        folder = Path(tmp)
        zs_grpc, triton_grpc = free_port(), free_port()
        servers = contenders(
            folder,
            args.triton_root,
            zeroserve_options=["--grpc-port", str(zs_grpc), "--load-model", "mlp_onnx"],
            triton_options=[f"--grpc-port={triton_grpc}"],
        )
        write_onnx_model(folder / "repo")
        http = {
            "zeroserve": f"127.0.0.1:{servers.zeroserve.port}",
            "triton": f"127.0.0.1:{servers.triton.port}",
        }
        grpc = {"zeroserve": f"127.0.0.1:{zs_grpc}", "triton": f"127.0.0.1:{triton_grpc}"}
        points: list[ComparePoint] = []
        failures: list[str] = []
        with onnxruntime_for_triton(folder / "ort"), servers.zeroserve, servers.triton:
            if args.profile is not None:
                protocol, shared_memory = VARIANTS[args.variants[0]]
                urls = http if protocol == "http" else grpc
                args.profile_text = _profile(
                    install,
                    args,
                    {"zeroserve": servers.zeroserve.pid, "triton": servers.triton.pid},
                    urls,
                    Path(tmp),
                )
                return [], []
            for repeat in range(args.repeats):
                for variant in args.variants:
                    protocol, shared_memory = VARIANTS[variant]
                    for concurrency in args.concurrency:
                        for key in rotated(CONTENDERS, repeat):
                            server = "triton" if key == "triton" else "zeroserve"
                            url = (http if protocol == "http" else grpc)[server]
                            try:
                                measured, stability = _measure(
                                    install,
                                    args,
                                    model=MODELS[key],
                                    url=url,
                                    protocol=protocol,
                                    concurrency=concurrency,
                                    shared_memory=shared_memory,
                                )
                            except PerfAnalyzerError as exc:
                                # One point lost, not the run: its cell shows the repeats
                                # that did measure.
                                failures.append(f"{variant} c={concurrency} {key}: {exc}")
                                print(f"FAILED {failures[-1][:2000]}", flush=True)
                                continue
                            point = ComparePoint(
                                key,
                                variant,
                                concurrency,
                                repeat,
                                measured.infer_per_s,
                                measured.p50_us,
                                measured.p99_us,
                                os.getloadavg()[0],
                                stability,
                            )
                            points.append(point)
                            print(
                                f"repeat {repeat} {variant:<8} c={concurrency:<3} {key:<20} "
                                f"{point.infer_per_s:9.1f} infer/s p50 {point.p50_us / 1000:.2f} "
                                f"p99 {point.p99_us / 1000:.2f} ms (load {point.load_average:.2f}, "
                                f"stable within {stability:g} %)",
                                flush=True,
                            )
                            time.sleep(args.pause_s)
        return points, failures


def table(
    points: Sequence[ComparePoint], variants: Sequence[str], concurrency: Sequence[int]
) -> str:
    """Medians per variant (protocol, shared memory) and concurrency: infer/s (p50 / p99
    ms), and each zeroserve contender's infer/s over Triton's."""
    rows = [
        "| variant | c | "
        + " | ".join(CONTENDERS)
        + " | "
        + " | ".join(f"{key}/triton" for key in CONTENDERS[:-1])
        + " |",
        "| --- | --- |" + " --- |" * (2 * len(CONTENDERS) - 1),
    ]
    for variant in variants:
        for c in concurrency:
            cells, rates = [], {}
            for key in CONTENDERS:
                chosen = [
                    p
                    for p in points
                    if p.contender == key and p.variant == variant and p.concurrency == c
                ]
                if not chosen:
                    cells.append("")
                    continue
                rate = statistics.median(p.infer_per_s for p in chosen)
                p50 = statistics.median(p.p50_us for p in chosen) / 1000
                p99 = statistics.median(p.p99_us for p in chosen) / 1000
                rates[key] = rate
                cells.append(f"{rate:,.0f} ({p50:.2f} / {p99:.2f})")
            triton = rates.get("triton")
            ratios = [
                f"{rates[key] / triton:.2f}" if triton and key in rates else ""
                for key in CONTENDERS[:-1]
            ]
            rows.append(f"| {variant} | {c} | " + " | ".join([*cells, *ratios]) + " |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    add_run_arguments(parser)
    parser.add_argument("--interval-ms", type=int, default=3000, help="perf_analyzer's window")
    parser.add_argument("--max-trials", type=int, default=5, help="windows until stable")
    parser.add_argument(
        "--stability-percentage",
        type=float,
        default=25.0,
        help="how far three windows may differ to count as stable (perf_analyzer's default "
        "10 is rarely met on a shared 2-core machine)",
    )
    parser.add_argument("--async", dest="is_async", action="store_true")
    parser.add_argument(
        "--variants",
        default="http,grpc",
        help=f"comma-separated rows to measure, of {', '.join(VARIANTS)} (-shm: tensors in "
        "system shared memory)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="c=1, one repeat, 100 requests a point"
    )
    parser.add_argument("--output", type=Path, help="write every point and the table as JSON")
    parser.add_argument(
        "--profile",
        choices=CONTENDERS[:-1],
        help="instead: one point of this contender (first --variants, first --concurrency), "
        "py-spy on zeroserve's process meanwhile, and the server CPU per inference of it and "
        "of Triton on the same point; the text goes to --output's folder or stdout",
    )
    parser.add_argument("--top", type=int, default=40, help="functions per profile ranking")
    args = parser.parse_args(argv)
    args.request_count = None
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants:
        parser.error(f"--variants takes {', '.join(VARIANTS)}; not {', '.join(unknown)}")
    if args.quick:
        args.concurrency, args.repeats, args.request_count, args.pause_s = [1], 1, 100, 0.0
    if not has_triton(args):
        return 2
    load_before = os.getloadavg()[0]
    points, failures = run(args)
    if args.profile is not None:
        text = args.profile_text
        print(text)
        if args.output is not None:
            args.output.write_text(text + "\n", encoding="utf-8")
        return 0
    text = table(points, args.variants, args.concurrency)
    print(text)
    print(f"load average before {load_before:.2f}, after {os.getloadavg()[0]:.2f}")
    if failures:
        print(f"{len(failures)} point(s) failed; see above")
    if args.output is not None and not args.quick:
        write_output(
            args.output,
            {
                "client": "perf_analyzer 2.51.0",
                "mode": "async" if args.is_async else "sync",
                "variants": args.variants,
                "points": [asdict(p) for p in points],
                "table": text,
                "failed_points": failures,
                "load_average_before": load_before,
                "cpu_count": os.cpu_count(),
            },
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
