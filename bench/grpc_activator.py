"""gRPC through the activator against gRPC straight to the worker, one call at a time.

One ``zeroserve up`` platform with its gRPC endpoint on (``ZEROSERVE_ACTIVATOR_GRPC_PORT``)
serves the light MLP, registered with ``min_replicas = max_replicas = 1`` so that one worker
holds it for the whole run. That worker is called two ways with the same pre-serialized
batch-1 ModelInferRequest (raw input contents): at the activator's gRPC port, and at the
worker's own (its ``grpc_address`` in the admin API). Each round times ``--calls`` calls
each way with a closed loop at concurrency 1 (a blocking grpcio client: one call in flight,
the next sent when the answer is in), after ``--warmup`` untimed calls; the ways alternate
which goes first from round to round, and medians over the rounds are reported. The target
(issue 15): the activator adds at most 1 ms at p50.

Both ways' answers are checked against ONNX Runtime before anything is timed. Results go to
``bench/results/<UTC time>-<tag>-grpc_activator.json``.

    python bench/grpc_activator.py           # 5 rounds of 2,000 calls each way
    python bench/grpc_activator.py --quick   # 2 rounds of 300
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

# Run as a script, sys.path[0] is bench/; the repository root must come first so that
# `bench` is a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc
import numpy as np
import onnxruntime

from bench import machine, report
from bench.models import INPUT_NAME, MODELS, OUTPUT_NAME, sample_rows, write_repository
from bench.platform_process import PlatformProcess
from bench.server import HOST, REPO_ROOT, free_port
from foundation.proto import grpc_service_pb2 as pb

RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
MODEL: Final = MODELS["light"]
INFER_PATH: Final = "/inference.GRPCInferenceService/ModelInfer"
ADDED_P50_MS: Final = 1.0
CALL_TIMEOUT_S: Final = 60.0
DIRECT: Final = "direct"
ACTIVATOR: Final = "activator"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per way and round")
    parser.add_argument("--warmup", type=int, default=200, help="untimed calls before each")
    parser.add_argument("--rounds", type=int, default=5, help="passes over both ways; medians")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 300 calls")
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.warmup, args.rounds = 300, 50, 2
    return args


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
    rows = sample_rows(MODEL, 1)
    request = infer_request(rows[0:1])
    with tempfile.TemporaryDirectory(prefix="zeroserve-grpc-bench-") as folder:
        workdir = Path(folder)
        repository = workdir / "models"
        write_repository(repository, [MODEL], max_queue_delay_us=0)
        session = onnxruntime.InferenceSession(str(repository / MODEL.name / "1" / "model.onnx"))
        (expected,) = session.run([OUTPUT_NAME], {INPUT_NAME: rows[0:1]})
        grpc_port = free_port()
        platform = PlatformProcess(
            workdir,
            cache_dir=workdir / "cache",
            allowed_storage=(str(repository),),
            env={"ZEROSERVE_ACTIVATOR_GRPC_PORT": str(grpc_port)},
        )
        with platform:
            scaling = {"min_replicas": 1, "max_replicas": 1}
            platform.register(MODEL.name, str(repository / MODEL.name), scaling)
            platform.load(MODEL.name)
            (worker,) = [w for w in platform.workers() if MODEL.name in w["models"]]
            addresses = {DIRECT: worker["grpc_address"], ACTIVATOR: f"{HOST}:{grpc_port}"}
            channels = {way: grpc.insecure_channel(address) for way, address in addresses.items()}
            try:
                for way, channel in channels.items():
                    answer = infer_call(channel)(request, timeout=CALL_TIMEOUT_S)
                    np.testing.assert_allclose(output_of(answer), expected, rtol=1e-4, atol=1e-5)
                    print(f"{way} ({addresses[way]}): answer checked against ONNX Runtime")
                rounds = []
                for index in range(args.rounds):
                    order = [DIRECT, ACTIVATOR] if index % 2 == 0 else [ACTIVATOR, DIRECT]
                    measured = {
                        way: percentiles(
                            time_calls(channels[way], request, args.calls, args.warmup)
                        )
                        for way in order
                    }
                    added = measured[ACTIVATOR]["p50_ms"] - measured[DIRECT]["p50_ms"]
                    rounds.append({"order": order, **measured, "added_p50_ms": round(added, 4)})
                    print(
                        f"round {index + 1}: direct p50 {measured[DIRECT]['p50_ms']:.3f} ms, "
                        f"activator p50 {measured[ACTIVATOR]['p50_ms']:.3f} ms, "
                        f"added {added:.3f} ms"
                    )
            finally:
                for channel in channels.values():
                    channel.close()
    summary = _summary(rounds)
    print(_table(summary))
    met = summary["added_p50_ms"] <= ADDED_P50_MS
    print(f"target: the activator adds <= {ADDED_P50_MS:g} ms at p50: {'met' if met else 'MISSED'}")
    if not args.no_save:
        document: dict[str, Any] = {
            "benchmark": "grpc_activator",
            "started_utc": started_utc.isoformat(),
            "model": {"name": MODEL.name, "widths": list(MODEL.widths)},
            "settings": {"calls": args.calls, "warmup": args.warmup, "rounds": args.rounds},
            "machine": machine.describe(REPO_ROOT, load_generator="grpcio blocking client, c=1"),
            "platform_command": platform.command,
            "rounds": rounds,
            "summary": summary,
            "target": {"added_p50_ms_at_most": ADDED_P50_MS, "met": met},
        }
        path = RESULTS_DIR / f"{stamp}-{tag}-grpc_activator.json"
        report.write_json(path, document)
        print(f"results: {path.relative_to(REPO_ROOT)}")
    return 0


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds, per way and of the added p50."""
    summary: dict[str, Any] = {
        way: {
            key: round(statistics.median(r[way][key] for r in rounds), 4)
            for key in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")
        }
        for way in (DIRECT, ACTIVATOR)
    }
    summary["added_p50_ms"] = round(statistics.median(r["added_p50_ms"] for r in rounds), 4)
    return summary


def _table(summary: dict[str, Any]) -> str:
    lines = ["way        p50 ms   p90 ms   p99 ms"]
    for way in (DIRECT, ACTIVATOR):
        s = summary[way]
        lines.append(f"{way:<9} {s['p50_ms']:>7.3f}  {s['p90_ms']:>7.3f}  {s['p99_ms']:>7.3f}")
    lines.append(f"added p50 (median over rounds): {summary['added_p50_ms']:.3f} ms")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
