"""The response cache: latency of a hit against a miss on the light MLP, one request at a time.

One ``python -m data_plane`` with ``--cache-config local,size=...`` serves the light MLP
twice, the same weights under two names: ``light_cached`` (``response_cache { enable:
true }``) and ``light`` (no cache). Three ways are timed, each ``--calls`` batch-1 binary
HTTP requests on one kept-alive connection, closed loop at concurrency 1 (the next request
sent when the answer is in), after ``--warmup`` untimed ones:

- ``hit``: the same request to ``light_cached``, answered from the cache;
- ``miss``: a new request each time to ``light_cached`` (its first input element counts
  up), so every one looks up, runs the model and stores its answer;
- ``uncached``: the same request to ``light``, the model run with no cache involved, the
  floor a miss is compared with.

Within a round the ways take turns in blocks of ``--block`` requests, so that the machine's
changing load falls on each alike, and they alternate which goes first from round to round;
medians over the rounds are reported. Every way's first answer is checked against ONNX
Runtime before anything is timed, and the server's statistics after the run must count
exactly the hits and misses sent. Beside them, what the cache itself costs per request is
timed in process (a hit's lookup; a miss's lookup and store) and read from the server's
statistics, to tell it from the rest of a request's path. Results, with the machine, go
to ``bench/results/<UTC time>-<tag>-response_cache.json``.

    python bench/response_cache.py           # 5 rounds of 2,000 requests each way
    python bench/response_cache.py --quick   # 2 rounds of 300
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import re
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

# Run as a script, sys.path[0] is bench/; the repository root must come first so that
# `bench` is a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import onnxruntime

from bench import machine, report
from bench.models import (
    INPUT_NAME,
    MODELS,
    OUTPUT_NAME,
    MlpSpec,
    RequestBody,
    config_text,
    request_body,
    sample_rows,
    write_model,
)
from bench.server import HOST, REPO_ROOT, ServerProcess, free_port, server_command
from data_plane.response_cache import ModelResponseCache, ResponseCache
from data_plane.stats import ModelStats

RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
UNCACHED: Final[MlpSpec] = MODELS["light"]
CACHED: Final[MlpSpec] = dataclasses.replace(UNCACHED, name="light_cached")
CACHE_BYTES: Final = 64 * 2**20
"""Far more than every answer of a run takes (about 100 bytes each): nothing is evicted."""
HIT: Final = "hit"
MISS: Final = "miss"
PLAIN: Final = "uncached"
WAYS: Final = (HIT, MISS, PLAIN)
TIMEOUT_S: Final = 60.0


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=2000, help="timed requests per way and round")
    parser.add_argument("--warmup", type=int, default=200, help="untimed requests before each")
    parser.add_argument("--rounds", type=int, default=5, help="passes over the ways; medians")
    parser.add_argument(
        "--block", type=int, default=100, help="requests of one way before the next way's"
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds of 300 requests")
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.warmup, args.rounds = 300, 50, 2
    return args


def write_repository(root: Path) -> None:
    """The light MLP as ``light`` and, the same weights, as ``light_cached``."""
    for spec, cache in ((UNCACHED, False), (CACHED, True)):
        write_model(spec, root / spec.name / "1" / "model.onnx")
        config = config_text(spec, max_queue_delay_us=0)
        if cache:
            config += "response_cache { enable: true }\n"
        (root / spec.name / "config.pbtxt").write_text(config, encoding="utf-8")


class Client:
    """Batch-1 binary infer requests on one kept-alive HTTP connection."""

    def __init__(self, port: int) -> None:
        self._connection = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT_S)

    def infer(self, model: str, body: RequestBody) -> tuple[bytes, int]:
        """The answer's body and the length of its JSON header."""
        headers = {"Content-Type": body.content_type}
        if body.header_length is not None:
            headers["Inference-Header-Content-Length"] = str(body.header_length)
        self._connection.request("POST", f"/v2/models/{model}/infer", body.body, headers)
        response = self._connection.getresponse()
        payload = response.read()
        if response.status != 200:
            raise RuntimeError(f"{model} answered {response.status}: {payload[:500]!r}")
        length = response.getheader("Inference-Header-Content-Length")
        return payload, int(length) if length is not None else len(payload)

    def get_json(self, path: str) -> Any:
        self._connection.request("GET", path)
        response = self._connection.getresponse()
        return json.loads(response.read())

    def close(self) -> None:
        self._connection.close()


def answer_of(client: Client, model: str, body: RequestBody) -> np.ndarray:
    """``OUTPUT0`` of ``model``'s binary answer to ``body``."""
    payload, header_length = client.infer(model, body)
    header = json.loads(payload[:header_length])
    (output,) = header["outputs"]
    assert output["name"] == OUTPUT_NAME, output
    data = payload[header_length:]
    return np.frombuffer(data, np.float32).reshape(output["shape"])


def time_requests(client: Client, model: str, bodies: Sequence[RequestBody]) -> list[float]:
    """Milliseconds of each request, one at a time."""
    latencies = []
    for body in bodies:
        started = time.perf_counter_ns()
        client.infer(model, body)
        latencies.append((time.perf_counter_ns() - started) / 1e6)
    return latencies


def percentiles(latencies: list[float]) -> dict[str, float]:
    values = np.asarray(latencies)
    return {f"p{q}_ms": round(float(np.percentile(values, q)), 4) for q in (50, 90, 99)} | {
        "mean_ms": round(float(values.mean()), 4)
    }


class MissBodies:
    """Requests none of which was sent before: the first input element counts up."""

    def __init__(self, row: np.ndarray) -> None:
        self._row = row.copy()
        self._next = 0

    def take(self, count: int) -> list[RequestBody]:
        bodies = []
        for _ in range(count):
            self._row[0, 0] = np.float32(1000.0 + self._next)
            self._next += 1
            bodies.append(request_body(CACHED, self._row[0], "binary"))
        return bodies


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    started_utc = datetime.now(UTC)
    stamp = started_utc.strftime("%Y-%m-%dT%H%M%SZ")
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", args.tag or socket.gethostname()).strip("-") or "host"
    row = sample_rows(UNCACHED, 1)
    same = request_body(UNCACHED, row[0], "binary")
    misses = MissBodies(row)
    sent = {HIT: 0, MISS: 0}
    with tempfile.TemporaryDirectory(prefix="zeroserve-cache-bench-") as folder:
        workdir = Path(folder)
        repository = workdir / "models"
        write_repository(repository)
        session = onnxruntime.InferenceSession(str(repository / UNCACHED.name / "1" / "model.onnx"))
        port = free_port()
        command = [
            *server_command(repository, port, [UNCACHED.name, CACHED.name]),
            "--grpc-port",
            "0",
            "--cache-config",
            f"local,size={CACHE_BYTES}",
        ]
        with ServerProcess(command, port, workdir / "server.log"):
            client = Client(port)
            try:
                (expected,) = session.run([OUTPUT_NAME], {INPUT_NAME: row})
                first_miss = misses.take(1)[0]
                miss_row = np.frombuffer(first_miss.body[first_miss.header_length :], np.float32)
                (expected_miss,) = session.run([OUTPUT_NAME], {INPUT_NAME: miss_row[None, :]})
                checks = {
                    PLAIN: (UNCACHED.name, same, expected),
                    MISS: (CACHED.name, first_miss, expected_miss),
                    HIT: (CACHED.name, same, expected),  # the first is a miss, then hits
                }
                for way, (model, body, answer) in checks.items():
                    np.testing.assert_allclose(
                        answer_of(client, model, body), answer, rtol=1e-4, atol=1e-5
                    )
                    print(f"{way}: answer checked against ONNX Runtime")
                np.testing.assert_allclose(
                    answer_of(client, CACHED.name, same), expected, rtol=1e-4, atol=1e-5
                )
                sent[MISS] += 2  # the checked miss, and the first of the same request
                sent[HIT] += 1
                rounds = []
                for index in range(args.rounds):
                    order = WAYS[index % 3 :] + WAYS[: index % 3]
                    latencies: dict[str, list[float]] = {way: [] for way in WAYS}
                    for block in range(-(-(args.warmup + args.calls) // args.block)):
                        start = block * args.block
                        count = min(args.block, args.warmup + args.calls - start)
                        for way in order:
                            if way == MISS:
                                model, bodies = CACHED.name, misses.take(count)
                            else:
                                model = CACHED.name if way == HIT else UNCACHED.name
                                bodies = [same] * count
                            timed = time_requests(client, model, bodies)
                            # The first requests of each way in a round are its warm-up.
                            skip = max(0, min(count, args.warmup - start))
                            latencies[way].extend(timed[skip:])
                            if way in sent:
                                sent[way] += count
                    measured = {way: percentiles(latencies[way]) for way in WAYS}
                    rounds.append({"order": list(order), **measured})
                    print(
                        f"round {index + 1}: "
                        + ", ".join(f"{way} p50 {measured[way]['p50_ms']:.3f} ms" for way in WAYS)
                    )
                stats = {
                    spec.name: client.get_json(f"/v2/models/{spec.name}/stats")["model_stats"][0]
                    for spec in (CACHED, UNCACHED)
                }
            finally:
                client.close()
    inference = stats[CACHED.name]["inference_stats"]
    counted = {HIT: inference["cache_hit"]["count"], MISS: inference["cache_miss"]["count"]}
    server_means_us = {
        f"{model}.{field}": round(value["ns"] / value["count"] / 1e3, 2)
        for model, entry in stats.items()
        for field, value in entry["inference_stats"].items()
        if value["count"]
    }
    if counted != sent:
        raise RuntimeError(f"the server counted {counted} hits and misses; {sent} were sent")
    print(f"server statistics: {counted[HIT]} hits and {counted[MISS]} misses, as sent")
    summary = _summary(rounds)
    costs = in_process_costs()
    print(_table(summary))
    print(
        f"the cache itself, in process: a hit's lookup {costs['hit_lookup_us']:.1f} us, a "
        f"miss's lookup and store {costs['miss_lookup_and_store_us']:.1f} us; in the server "
        f"(its statistics): {server_means_us[f'{CACHED.name}.cache_hit']:.1f} us a hit, "
        f"{server_means_us[f'{CACHED.name}.cache_miss']:.1f} us a miss"
    )
    if not args.no_save:
        document: dict[str, Any] = {
            "benchmark": "response_cache",
            "started_utc": started_utc.isoformat(),
            "model": {"name": UNCACHED.name, "widths": list(UNCACHED.widths)},
            "settings": {
                "calls": args.calls,
                "warmup": args.warmup,
                "rounds": args.rounds,
                "cache_bytes": CACHE_BYTES,
                "encoding": "binary",
            },
            "machine": machine.describe(
                REPO_ROOT, load_generator="http.client, one kept-alive connection, c=1"
            ),
            "server_command": command,
            "rounds": rounds,
            "server_counts": counted,
            "summary": summary,
            "in_process_costs": costs,
            "server_means_us": server_means_us,
        }
        path = RESULTS_DIR / f"{stamp}-{tag}-response_cache.json"
        report.write_json(path, document)
        print(f"results: {path.relative_to(REPO_ROOT)}")
    return 0


def in_process_costs(repeats: int = 5, count: int = 5000) -> dict[str, float]:
    """Microseconds the cache itself takes per request, in this process, for the light
    MLP's tensors (a 1x256 FP32 input, a 1x10 FP32 answer): a hit's lookup, and a miss's
    lookup and store. Medians of ``repeats`` runs of ``count``."""
    cache = ResponseCache(CACHE_BYTES)
    view = ModelResponseCache(cache, model=CACHED.name, version=1, stats=ModelStats())
    inputs = {INPUT_NAME: sample_rows(UNCACHED, 1)}
    answer = {OUTPUT_NAME: np.zeros((1, UNCACHED.output_size), np.float32)}
    view.store(view.lookup(inputs, None), answer)
    distinct = sample_rows(UNCACHED, 1)
    counter = iter(range(repeats * count * 2))

    def miss() -> None:
        distinct[0, 0] = np.float32(next(counter))
        lookup = view.lookup({INPUT_NAME: distinct}, None)
        view.store(lookup, answer)

    def per_call_us(call: Callable[[], object]) -> float:
        runs = []
        for _ in range(repeats):
            started = time.perf_counter_ns()
            for _ in range(count):
                call()
            runs.append((time.perf_counter_ns() - started) / count / 1e3)
        return round(statistics.median(runs), 2)

    return {
        "hit_lookup_us": per_call_us(lambda: view.lookup(inputs, None)),
        "miss_lookup_and_store_us": per_call_us(miss),
    }


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds, per way, and the hit's p50 against the others'."""
    summary: dict[str, Any] = {
        way: {
            key: round(statistics.median(r[way][key] for r in rounds), 4)
            for key in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")
        }
        for way in WAYS
    }
    summary["hit_over_miss_p50"] = round(summary[HIT]["p50_ms"] / summary[MISS]["p50_ms"], 3)
    summary["miss_minus_uncached_p50_ms"] = round(
        summary[MISS]["p50_ms"] - summary[PLAIN]["p50_ms"], 4
    )
    return summary


def _table(summary: dict[str, Any]) -> str:
    lines = ["way        p50 ms   p90 ms   p99 ms  (medians over rounds)"]
    for way in WAYS:
        s = summary[way]
        lines.append(f"{way:<9} {s['p50_ms']:>7.3f}  {s['p90_ms']:>7.3f}  {s['p99_ms']:>7.3f}")
    lines.append(
        f"hit / miss at p50: {summary['hit_over_miss_p50']:.3f}; a miss costs "
        f"{summary['miss_minus_uncached_p50_ms']:+.3f} ms at p50 over the uncached model"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
