"""gRPC through the activator against gRPC straight to the worker, one call at a time.

For each of the activator's set-ups (``--frontends``: its gRPC front end, grpc.aio or h2corn,
and, after a colon, how its calls reach the worker, ``grpc-web`` over its HTTP/1.1
connections or ``grpc`` over a grpc.aio channel) one ``zeroserve up`` platform with its
gRPC endpoint on (``ZEROSERVE_ACTIVATOR_GRPC_PORT``, ``ZEROSERVE_ACTIVATOR_GRPC_FRONTEND``,
``ZEROSERVE_ACTIVATOR_GRPC_WORKER_PROTOCOL``) serves the light MLP, registered with
``min_replicas = max_replicas = 1`` so that one worker holds it for the whole run. That
worker is called two ways with batch-1 ModelInfer calls: at the activator's gRPC port, and
at the worker's own (its ``grpc_address`` in the admin API). The client is Triton's
``perf_analyzer`` (concurrency 1, sync; its p50 over stable windows) or, with ``--client
grpcio``, a blocking grpcio client sending one pre-serialized request at a time (``--calls``
after ``--warmup``). Each round measures every way, in an order rotated from round to round;
medians over the rounds are reported, and the added p50 is the median over rounds of
activator less direct on the same platform. The target (issue 25): the activator adds at most
0.3 ms at p50.

Every way's answer is checked against ONNX Runtime before anything is timed. Results go to
``bench/results/<UTC time>-<tag>-grpc_activator.json``.

    python bench/grpc_activator.py           # 5 rounds, perf_analyzer, h2corn, both hops
    python bench/grpc_activator.py --quick   # 2 short rounds
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

# Run as a script, sys.path[0] is bench/; the repository root must come first so that
# `bench` is a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

import grpc
import numpy as np
import onnxruntime

from bench import machine, profiling, report
from bench.models import INPUT_NAME, MODELS, OUTPUT_NAME, sample_rows, write_repository
from bench.perf_analyzer import (
    PerfAnalyzerInstall,
    perf_analyzer_install,
    run_point,
    run_settled_point,
)
from bench.platform_process import PlatformProcess
from bench.server import HOST, REPO_ROOT, free_port
from foundation.proto import grpc_service_pb2 as pb

RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
MODEL: Final = MODELS["light"]
INFER_PATH: Final = "/inference.GRPCInferenceService/ModelInfer"
ADDED_P50_MS: Final = 0.3
CALL_TIMEOUT_S: Final = 60.0
DIRECT: Final = "direct"
ACTIVATOR: Final = "activator"
FRONTENDS: Final = ("aio", "h2corn")
WORKER_PROTOCOLS: Final = ("grpc-web", "grpc")
DEFAULT_SETUPS: Final = ("h2corn:grpc-web", "h2corn:grpc")


def setup_env(setup: str) -> dict[str, str]:
    """The activator's settings for a set-up ``FRONTEND[:PROTOCOL]``."""
    frontend, _, protocol = setup.partition(":")
    env = {"ZEROSERVE_ACTIVATOR_GRPC_FRONTEND": frontend}
    if protocol:
        env["ZEROSERVE_ACTIVATOR_GRPC_WORKER_PROTOCOL"] = protocol
    return env


def _is_setup(setup: str) -> bool:
    frontend, _, protocol = setup.partition(":")
    return frontend in FRONTENDS and (not protocol or protocol in WORKER_PROTOCOLS)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--frontends",
        default=",".join(DEFAULT_SETUPS),
        help="the activator's set-ups to measure, a platform each: FRONTEND[:PROTOCOL], "
        f"FRONTEND one of {', '.join(FRONTENDS)}, PROTOCOL (the hop to the worker; default "
        f"the activator's) one of {', '.join(WORKER_PROTOCOLS)}",
    )
    parser.add_argument("--client", choices=["perf_analyzer", "grpcio"], default="perf_analyzer")
    parser.add_argument("--interval-ms", type=int, default=3000, help="perf_analyzer's window")
    parser.add_argument("--calls", type=int, default=2000, help="grpcio: timed calls per way")
    parser.add_argument("--warmup", type=int, default=200, help="grpcio: untimed calls first")
    parser.add_argument("--rounds", type=int, default=5, help="passes over every way; medians")
    parser.add_argument("--quick", action="store_true", help="2 short rounds")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead: py-spy the platform (its activator) while perf_analyzer calls it at "
        "c=1, one front end (the first of --frontends); writes ...-grpc_activator-profile.txt",
    )
    parser.add_argument("--profile-s", type=int, default=20, help="seconds profiled")
    parser.add_argument(
        "--native",
        action="store_true",
        help="with --profile: native frames too (py-spy pauses the process for each sample)",
    )
    parser.add_argument("--top", type=int, default=40, help="functions per profile ranking")
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    args = parser.parse_args(argv)
    args.frontend_list = [f.strip() for f in args.frontends.split(",") if f.strip()]
    if not args.frontend_list or not all(_is_setup(f) for f in args.frontend_list):
        parser.error("--frontends takes FRONTEND[:PROTOCOL] (see --help)")
    if args.quick:
        args.calls, args.warmup, args.rounds, args.interval_ms = 300, 50, 2, 1000
    return args


def way(kind: str, frontend: str) -> str:
    """A way's name: how it is reached (direct, activator) on which front end's platform."""
    return f"{kind}/{frontend}"


def infer_request(row: np.ndarray) -> bytes:
    """A batch-1 ModelInferRequest for the light MLP, input as raw contents."""
    request = pb.ModelInferRequest(model_name=MODEL.name)
    request.inputs.add(name=INPUT_NAME, datatype="FP32", shape=[1, MODEL.input_size])
    request.outputs.add(name=OUTPUT_NAME)
    request.raw_input_contents.append(np.ascontiguousarray(row, np.float32).tobytes())
    return request.SerializeToString()


def output_of(answer: bytes) -> np.ndarray:
    response = pb.ModelInferResponse.FromString(answer)
    (output,) = response.outputs
    assert output.name == OUTPUT_NAME, output
    return np.frombuffer(response.raw_output_contents[0], np.float32).reshape(list(output.shape))


def infer_call(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable[bytes, bytes]:
    """ModelInfer on ``channel``, bytes in and out (no (de)serialization in the timed loop)."""
    infer: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(INFER_PATH)
    return infer


def time_calls(channel: grpc.Channel, request: bytes, calls: int, warmup: int) -> list[float]:
    """Milliseconds of each of ``calls`` calls, one at a time, after ``warmup`` untimed."""
    infer = infer_call(channel)
    for _ in range(warmup):
        infer(request, timeout=CALL_TIMEOUT_S)
    latencies = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        infer(request, timeout=CALL_TIMEOUT_S)
        latencies.append((time.perf_counter_ns() - started) / 1e6)
    return latencies


def percentiles(latencies: list[float]) -> dict[str, float]:
    values = np.asarray(latencies)
    return {f"p{q}_ms": round(float(np.percentile(values, q)), 4) for q in (50, 90, 99)} | {
        "mean_ms": round(float(values.mean()), 4)
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    started_utc = datetime.now(UTC)
    stamp = started_utc.strftime("%Y-%m-%dT%H%M%SZ")
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", args.tag or socket.gethostname()).strip("-") or "host"
    install: PerfAnalyzerInstall | None = None
    if args.client == "perf_analyzer":
        found = perf_analyzer_install()
        if isinstance(found, str):
            print(f"perf_analyzer cannot run here ({found}); try --client grpcio", file=sys.stderr)
            return 2
        install = found
    rows = sample_rows(MODEL, 1)
    request = infer_request(rows[0:1])
    with tempfile.TemporaryDirectory(prefix="zeroserve-grpc-bench-") as folder:
        workdir = Path(folder)
        repository = workdir / "models"
        write_repository(repository, [MODEL], max_queue_delay_us=0)
        session = onnxruntime.InferenceSession(str(repository / MODEL.name / "1" / "model.onnx"))
        (expected,) = session.run([OUTPUT_NAME], {INPUT_NAME: rows[0:1]})
        addresses: dict[str, str] = {}
        commands: dict[str, list[str]] = {}
        pids: dict[str, int] = {}
        with contextlib.ExitStack() as stack:
            for frontend in args.frontend_list:
                grpc_port = free_port()
                platform = stack.enter_context(
                    PlatformProcess(
                        workdir,
                        cache_dir=workdir / f"cache-{frontend.replace(':', '-')}",
                        allowed_storage=(str(repository),),
                        env={
                            "ZEROSERVE_ACTIVATOR_GRPC_PORT": str(grpc_port),
                            **setup_env(frontend),
                        },
                        name=f"platform-{frontend.replace(':', '-')}",
                    )
                )
                commands[frontend] = platform.command
                pids[frontend] = platform.pid
                scaling = {"min_replicas": 1, "max_replicas": 1}
                platform.register(MODEL.name, str(repository / MODEL.name), scaling)
                platform.load(MODEL.name)
                (worker,) = [w for w in platform.workers() if MODEL.name in w["models"]]
                addresses[way(DIRECT, frontend)] = worker["grpc_address"]
                addresses[way(ACTIVATOR, frontend)] = f"{HOST}:{grpc_port}"
            if args.profile:
                assert install is not None
                frontend = args.frontend_list[0]
                text = _profile(args, install, pids[frontend], addresses[way(ACTIVATOR, frontend)])
                if not args.no_save:
                    kind = "profile-native" if args.native else "profile"
                    path = RESULTS_DIR / f"{stamp}-{tag}-grpc_activator-{kind}.txt"
                    path.write_text(text, encoding="utf-8")
                    print(f"profile: {path.relative_to(REPO_ROOT)}")
                print(text)
                return 0
            for name, address in addresses.items():
                with grpc.insecure_channel(address) as channel:
                    answer = infer_call(channel)(request, timeout=CALL_TIMEOUT_S)
                np.testing.assert_allclose(output_of(answer), expected, rtol=1e-4, atol=1e-5)
                print(f"{name} ({address}): answer checked against ONNX Runtime", flush=True)
            rounds = [
                _round(args, install, addresses, request, index) for index in range(args.rounds)
            ]
    summary = _summary(rounds, args.frontend_list)
    print(_table(summary, args.frontend_list))
    met = {f: summary["added_p50_ms"][f] <= ADDED_P50_MS for f in args.frontend_list}
    for frontend, is_met in met.items():
        print(
            f"target: the activator ({frontend}) adds <= {ADDED_P50_MS:g} ms at p50: "
            f"{'met' if is_met else 'MISSED'}"
        )
    if not args.no_save:
        client = (
            "perf_analyzer 2.51.0, gRPC, concurrency 1, sync"
            if args.client == "perf_analyzer"
            else "grpcio blocking client, c=1"
        )
        document: dict[str, Any] = {
            "benchmark": "grpc_activator",
            "started_utc": started_utc.isoformat(),
            "model": {"name": MODEL.name, "widths": list(MODEL.widths)},
            "settings": {
                "client": args.client,
                "frontends": args.frontend_list,
                "interval_ms": args.interval_ms,
                "calls": args.calls,
                "warmup": args.warmup,
                "rounds": args.rounds,
            },
            "machine": machine.describe(REPO_ROOT, load_generator=client),
            "platform_commands": commands,
            "rounds": rounds,
            "summary": summary,
            "target": {"added_p50_ms_at_most": ADDED_P50_MS, "met": met},
        }
        path = RESULTS_DIR / f"{stamp}-{tag}-grpc_activator.json"
        report.write_json(path, document)
        print(f"results: {path.relative_to(REPO_ROOT)}")
    return 0


def _profile(args: argparse.Namespace, install: PerfAnalyzerInstall, pid: int, address: str) -> str:
    """py-spy's rankings of the platform process (activator, control plane) while
    perf_analyzer calls ``address`` at c=1 for ``--profile-s`` seconds, with its threads'
    CPU and the calls per second it served meanwhile."""
    with tempfile.TemporaryDirectory(prefix="zeroserve-grpc-profile-") as folder:
        raw = Path(folder) / "pyspy-raw.txt"
        spy_command = profiling.pyspy_command(pid, raw, args.profile_s, native=args.native)
        spy = subprocess.Popen(spy_command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            before = profiling.thread_cpu_seconds(pid)
            started = time.perf_counter()
            point = run_point(
                install,
                model=MODEL.name,
                url=address,
                protocol="grpc",
                concurrency=1,
                request_count=None,
                measurement_interval_ms=args.profile_s * 1000 // 3,
                extra=["--max-trials", "3", "--stability-percentage", "100"],
            )
            seconds = time.perf_counter() - started
            after = profiling.thread_cpu_seconds(pid)
            spy.communicate(timeout=args.profile_s + 60)
        finally:
            if spy.poll() is None:
                spy.kill()
                spy.wait()
        folded = profiling.fold_pyspy(raw, REPO_ROOT)
    head = (
        f"activator gRPC ({args.frontend_list[0]}) under perf_analyzer c=1, sync: "
        f"{point.infer_per_s:.0f} infer/s, p50 {point.p50_us / 1000:.3f} ms, platform CPU "
        "below per thread over the whole measurement"
    )
    return "\n\n".join(
        [
            head,
            profiling.thread_cpu_text(pid, before, after, seconds, folded.thread_names),
            profiling.pyspy_text(folded, top=args.top),
        ]
    )


def _round(
    args: argparse.Namespace,
    install: PerfAnalyzerInstall | None,
    addresses: dict[str, str],
    request: bytes,
    index: int,
) -> dict[str, Any]:
    """Every way measured once, in an order rotated by ``index``."""
    names = list(addresses)
    shift = index % len(names)
    order = names[shift:] + names[:shift]
    measured: dict[str, dict[str, float]] = {}
    for name in order:
        if install is not None:
            point, _ = run_settled_point(
                install,
                stability_percentage=25.0,
                max_trials=5,
                model=MODEL.name,
                url=addresses[name],
                protocol="grpc",
                concurrency=1,
                measurement_interval_ms=args.interval_ms,
            )
            measured[name] = {
                "p50_ms": round(point.p50_us / 1000, 4),
                "p99_ms": round(point.p99_us / 1000, 4),
                "infer_per_s": round(point.infer_per_s, 1),
            }
        else:
            with grpc.insecure_channel(addresses[name]) as channel:
                measured[name] = percentiles(time_calls(channel, request, args.calls, args.warmup))
    added = {
        frontend: round(
            measured[way(ACTIVATOR, frontend)]["p50_ms"]
            - measured[way(DIRECT, frontend)]["p50_ms"],
            4,
        )
        for frontend in args.frontend_list
    }
    print(
        f"round {index + 1}: "
        + ", ".join(f"{name} p50 {m['p50_ms']:.3f} ms" for name, m in measured.items())
        + "; added "
        + ", ".join(f"{f} {a:.3f} ms" for f, a in added.items()),
        flush=True,
    )
    return {"order": order, "ways": measured, "added_p50_ms": added}


def _summary(rounds: list[dict[str, Any]], frontends: list[str]) -> dict[str, Any]:
    """Medians over the rounds, per way and of the added p50 per front end."""
    names = list(rounds[0]["ways"])
    return {
        "ways": {
            name: {
                key: round(statistics.median(r["ways"][name][key] for r in rounds), 4)
                for key in rounds[0]["ways"][name]
            }
            for name in names
        },
        "added_p50_ms": {
            f: round(statistics.median(r["added_p50_ms"][f] for r in rounds), 4) for f in frontends
        },
    }


def _table(summary: dict[str, Any], frontends: list[str]) -> str:
    lines = ["way                p50 ms   p99 ms"]
    for name, s in summary["ways"].items():
        lines.append(f"{name:<17} {s['p50_ms']:>7.3f}  {s['p99_ms']:>7.3f}")
    for frontend in frontends:
        added = summary["added_p50_ms"][frontend]
        lines.append(f"added p50, {frontend} (median over rounds): {added:.3f} ms")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
