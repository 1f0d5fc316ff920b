"""Where one request's time goes at c=1, read from each server's own trace: zeroserve's
Triton-compatible path and its in-process path against Triton 2.51's Python backend
(issue 16's analysis of why the stub path trails Triton with one client).

The servers and the model are those of :mod:`bench.python_backend`. Both servers run with
Triton's trace options (``--trace-config triton,file=... rate=N level=TIMESTAMPS``, which
zeroserve reads the same way) and write Triton's trace file when they stop. Closed loop
with wrk at ``--concurrency`` (1 by default), the contenders in a rotated order for each
repeat. Per contender the table gives medians over the traced requests:

- the cycle: one request's share of the run, ``1 / rate`` at c=1;
- request start -> compute start: from the request entering the core (after HTTP and JSON
  decoding) to its batch starting to execute;
- compute start -> answer ready: the execution, hand-off to the stub process and back
  included, until the request's answer is ready for HTTP (:data:`ANSWERED`);
- outside the trace: the cycle less request start -> answer ready: reading and decoding
  the HTTP request, encoding and sending the answer, the wake-ups, and the client.

    python -m bench.python_backend_segments --output RESULT.json

(results go to ``bench/results/<UTC>-vm-python_backend_segments.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from bench.python_backend import (
    CONTENDERS,
    add_run_arguments,
    check_answers,
    contenders,
    has_triton,
    onnxruntime_for_triton,
    write_output,
    wrk,
)

ANSWERED: Final = ("INFER_RESPONSE_COMPLETE", "REQUEST_END")
"""When a request's answer was ready, the first of these the trace has: Triton hands a
Python-backend response to HTTP (``INFER_RESPONSE_COMPLETE``) before its ``COMPUTE_END`` and
``REQUEST_END``, which come after the stub's clean-up; zeroserve's request ends with its
answer."""
LABELS: Final = {
    "cycle": "cycle (1 / rate)",
    "queue": "request start -> compute start",
    "compute": "compute start -> answer ready (stub hand-off, model, back)",
    "outside": "outside the trace (HTTP, JSON, wake-ups, client)",
}


def trace_options(path: Path, rate: int) -> list[str]:
    """Triton's options tracing one request in ``rate`` with timestamps into ``path``."""
    return [
        f"--trace-config=triton,file={path}",
        f"--trace-config=rate={rate}",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=count=-1",
    ]


def timestamps_by_trace(entries: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, int]]:
    """Each trace id's timestamps by name. Triton writes one request's timestamps over
    several entries of the same id (the HTTP ones apart from the core's)."""
    found: dict[int, dict[str, int]] = defaultdict(dict)
    for entry in entries:
        for stamp in entry.get("timestamps", ()):
            found[int(entry["id"])][str(stamp["name"])] = int(stamp["ns"])
    return dict(found)


def model_by_trace(entries: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """Each trace id's model, named in one of its entries."""
    return {int(e["id"]): str(e["model_name"]) for e in entries if "model_name" in e}


def spans_us(entries: Iterable[Mapping[str, Any]]) -> dict[str, list[float]]:
    """The spans (µs) of every request traced with the timestamps they need: ``queue``
    (request start -> compute start), ``compute`` (compute start -> answer ready, see
    :data:`ANSWERED`) and ``request`` (request start -> answer ready)."""
    spans: dict[str, list[float]] = {"queue": [], "compute": [], "request": []}
    for stamps in timestamps_by_trace(entries).values():
        answered = next((stamps[name] for name in ANSWERED if name in stamps), None)
        start, compute = stamps.get("REQUEST_START"), stamps.get("COMPUTE_START")
        if answered is None or start is None or compute is None:
            continue
        spans["queue"].append((compute - start) / 1000)
        spans["compute"].append((answered - compute) / 1000)
        spans["request"].append((answered - start) / 1000)
    return spans


def summary(spans: Mapping[str, Sequence[float]], rates: Sequence[float]) -> dict[str, float]:
    """Medians of the spans and of the cycle (µs); ``outside`` is what the trace leaves
    out of the cycle. Raises ValueError when nothing was traced."""
    if not spans["request"]:
        raise ValueError("no request was traced with the timestamps needed")
    cycle = 1e6 / statistics.median(rates)
    return {
        "cycle": cycle,
        "queue": statistics.median(spans["queue"]),
        "compute": statistics.median(spans["compute"]),
        "outside": cycle - statistics.median(spans["request"]),
        "traced": float(len(spans["request"])),
    }


def table(summaries: Mapping[str, Mapping[str, float]]) -> str:
    keys = [key for key in CONTENDERS if key in summaries]
    rows = ["| µs, medians | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys)]
    for name, label in LABELS.items():
        cells = [f"{summaries[key][name]:,.0f}" for key in keys]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    rows.append(
        "| requests traced | " + " | ".join(f"{summaries[k]['traced']:,.0f}" for k in keys) + " |"
    )
    return "\n".join(rows)


@dataclass(frozen=True)
class Run:
    contender: str
    repeat: int
    requests_per_s: float


def run(args: argparse.Namespace) -> tuple[list[Run], dict[str, dict[str, float]]]:
    with tempfile.TemporaryDirectory(prefix="zeroserve-bench-segments-") as tmp:
        folder = Path(tmp)
        zs_trace, triton_trace = folder / "zeroserve-trace.json", folder / "triton-trace.json"
        servers = contenders(
            folder,
            args.triton_root,
            zeroserve_options=trace_options(zs_trace, args.trace_rate),
            triton_options=trace_options(triton_trace, args.trace_rate),
        )
        urls, body, script = servers.urls, servers.body, servers.script
        runs: list[Run] = []
        with onnxruntime_for_triton(folder / "ort"):
            with servers.zeroserve, servers.triton:
                check_answers(urls, body)
                for key in CONTENDERS:
                    wrk(urls[key], script, 8, args.warmup_s)
                for repeat in range(args.repeats):
                    for key in CONTENDERS[repeat % 3 :] + CONTENDERS[: repeat % 3]:
                        rate = wrk(urls[key], script, args.concurrency, args.duration_s)
                        runs.append(Run(key, repeat, rate))
                        print(f"repeat {repeat} {key:<20} {rate:9.1f} infer/s", flush=True)
                        time.sleep(args.pause_s)
            # The trace files are whole once their servers stopped.
            zs_entries = json.loads(zs_trace.read_text())
            triton_entries = json.loads(triton_trace.read_text())
    models = model_by_trace(zs_entries)
    entries = {
        "zeroserve_triton": [e for e in zs_entries if models.get(e["id"]) == "mlp_triton"],
        "zeroserve_inprocess": [e for e in zs_entries if models.get(e["id"]) == "mlp_inprocess"],
        "triton": triton_entries,
    }
    summaries = {
        key: summary(spans_us(entries[key]), [r.requests_per_s for r in runs if r.contender == key])
        for key in CONTENDERS
    }
    return runs, summaries


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=1)
    add_run_arguments(parser)
    parser.add_argument("--trace-rate", type=int, default=20, help="trace one request in N")
    parser.add_argument("--output", type=Path, help="write the runs and the table as JSON")
    args = parser.parse_args(argv)
    if not has_triton(args):
        return 2
    runs, summaries = run(args)
    text = table(summaries)
    print(text)
    if args.output is not None:
        write_output(
            args.output,
            {
                "concurrency": args.concurrency,
                "trace_rate": args.trace_rate,
                "runs": [asdict(r) for r in runs],
                "summaries_us": summaries,
                "table": text,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
