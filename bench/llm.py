"""LLM benchmark: tokens/s, time to first token and inter-token latency through the activator
against the engine called directly in this process, in the same run; and wake from sleep
against a full reload.

The model is the test suite's random-weights Llama (``bench.tiny_llm``, built here, nothing
downloaded) at a bench size (``--layers``, ``--hidden``), served by the transformers engine on
CPU. The same model folder is

* loaded in this process as a bare :class:`runtimes.llm.hf_engine.HFEngine` ("engine": the
  continuous batching manager fed token ids, no engine process and no server), and
* registered with a ``zeroserve up`` platform (``min_replicas = max_replicas = 1``), whose
  activator is called with streamed ``/v1/completions`` over HTTP ("activator"), and whose
  worker is called the same way at its own port ("worker", to tell the data plane's share
  of the difference from the activator's).

At each concurrency (``--concurrency``, 1, 8 and 32 by default) every client sends requests
back to back: a prompt of ``--prompt-words`` words, ``max_tokens`` of ``--max-tokens``,
greedy (a random model rarely hits its EOS; a request counts the tokens it produced). All
paths take the same prompts, one level at a time, in an order that rotates; repeats visit
the levels again and medians are reported. Tokens/s is
completion tokens over the level's wall time; TTFT is from sending to the first token; ITL is
the gap between token-bearing chunks (``stream_options.include_usage`` gives exact token
counts over HTTP). Target: the activator's tokens/s at concurrency 32 is at least 90 % of the
engine's.

Wake against reload is measured on a second, larger model of the same kind (``--wake-layers``,
``--wake-hidden``: a few hundred MB of weights, where the load's cost shows), registered on the
same platform after the throughput levels, through its worker's repository API: ``sleep``
then ``wake`` (timed), against ``unload`` then ``load`` from the node cache (timed), each
followed by one greedy request whose text must equal the first one.

Results go to ``bench/results/<UTC time>-<tag>-llm.json``.

    python bench/llm.py             # full run (a few minutes)
    python bench/llm.py --quick     # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import random
import re
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

# Run as a script, sys.path[0] is bench/; the repository root must come first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import torch

from bench import machine, report
from bench.platform_process import PlatformProcess
from bench.server import REPO_ROOT, process_tree_cpu_seconds, request
from bench.tiny_llm import WORDS, write_tiny_llm
from foundation import model_config
from runtimes.llm.hf import OPTIONS, TransformersRuntime
from runtimes.llm.hf_engine import HFEngine, TokenUpdate
from runtimes.llm.parameters import read_parameters
from runtimes.llm.text import IncrementalDetokenizer

RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
MODEL: Final = "bench-llm"
WAKE_MODEL: Final = "bench-llm-wake"
ENGINE: Final = "engine"
WORKER: Final = "worker"
ACTIVATOR: Final = "activator"
PATHS: Final = (ENGINE, WORKER, ACTIVATOR)
TARGET_RATIO: Final = 0.9
TARGET_CONCURRENCY: Final = 32
REQUEST_TIMEOUT_S: Final = 300.0


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--concurrency", default="1,8,32", help="clients at once, per level")
    parser.add_argument("--requests", type=int, default=3, help="requests per client per level")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-words", type=int, default=16)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2, help="passes over the levels")
    parser.add_argument("--cycles", type=int, default=3, help="sleep/wake and reload cycles")
    parser.add_argument("--wake-layers", type=int, default=8, help="the wake/reload model's")
    parser.add_argument("--wake-hidden", type=int, default=1024, help="the wake/reload model's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of each engine (OMP_NUM_THREADS): this process's and the worker's",
    )
    parser.add_argument("--quick", action="store_true", help="1 repeat, 1 request, 16 tokens")
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no file")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.requests, args.max_tokens, args.cycles = 1, 1, 16, 1
        args.wake_layers, args.wake_hidden = 4, 512
    args.levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if not args.levels or min(args.levels) < 1 or args.requests < 1 or args.repeats < 1:
        parser.error("--concurrency, --requests and --repeats must be positive")
    return args


@dataclass
class _Level:
    """One concurrency on one path, with its repeats."""

    concurrency: int
    path: str
    repeats: list[dict[str, Any]] = field(default_factory=list)

    def median(self, key: str) -> float:
        return report.median_of(self.repeats, key)


@dataclass
class _Sample:
    """One request: when it started, its first token, its token gaps, its tokens."""

    first_token_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    started = time.monotonic()
    started_utc = datetime.now(UTC)
    stamp = started_utc.strftime("%Y-%m-%dT%H%M%SZ")
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", args.tag or socket.gethostname()).strip("-") or "host"
    with tempfile.TemporaryDirectory(prefix="zeroserve-bench-llm-") as tmp:
        workdir = Path(tmp)
        repo = workdir / "models"
        model_dir = write_tiny_llm(
            repo,
            MODEL,
            layers=args.layers,
            hidden=args.hidden,
            max_model_len=1024,
            parameters={"max_num_seqs": "64"},
        )
        wake_dir = write_tiny_llm(
            repo, WAKE_MODEL, layers=args.wake_layers, hidden=args.wake_hidden, seed=1
        )
        # Both engines get the same thread count. On a small machine shared with the client
        # and the platform, torch's default (one thread per core) makes its threads fight for
        # the cores and runs several times slower than one thread.
        torch.set_num_threads(args.threads)
        threads = {"OMP_NUM_THREADS": str(args.threads)}
        with PlatformProcess(
            workdir, cache_dir=workdir / "cache", allowed_storage=(str(repo),), env=threads
        ) as platform:
            platform.register(MODEL, str(model_dir), {"min_replicas": 1, "max_replicas": 1})
            platform.load(MODEL)
            [worker] = [w for w in platform.workers() if MODEL in w["models"]]
            levels = asyncio.run(_run(args, model_dir, platform, worker))
            platform.register(WAKE_MODEL, str(wake_dir), {"min_replicas": 1, "max_replicas": 1})
            platform.load(WAKE_MODEL)
            wake = _wake_vs_reload(args, platform, wake_dir)
            command = platform.command
    targets = _targets(levels)
    print(_table(levels, args))
    print(_wake_text(wake))
    print(report.targets_text(targets))
    description = machine.describe(REPO_ROOT, load_generator="bench/llm.py (httpx, asyncio)")
    description["packages"].update(
        {name: machine._version(name) for name in ("torch", "transformers", "tokenizers")}
    )
    document: dict[str, Any] = {
        "benchmark": "llm",
        "started_utc": started_utc.isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - started, 1),
        "argv": sys.argv,
        "quick": args.quick,
        "machine": description,
        "settings": {
            "model": f"Llama, random weights, {args.layers} layers, hidden {args.hidden}, "
            f"vocab {len(WORDS) + 3} (word-level), fp32, CPU",
            "engine": "transformers continuous batching (runtimes/llm/hf.py)",
            "torch_threads_per_engine": args.threads,
            "concurrency": args.levels,
            "requests_per_client": args.requests,
            "max_tokens": args.max_tokens,
            "prompt_words": args.prompt_words,
            "sampling": "greedy",
            "repeats": args.repeats,
            "order": "levels ascending; at each level the three paths back to back, the "
            "first one rotating with (level index + repeat)",
            "engine_path": "runtimes.llm.hf_engine.HFEngine called directly in the benchmark "
            "process (no engine process, no server)",
            "activator_path": "POST /v1/completions, stream, through zeroserve up's activator "
            "to one worker (zeroserve serve); httpx client in the benchmark process",
            "worker_path": "the same requests straight to that worker's port",
            "platform_command": command,
        },
        "levels": [
            {
                "concurrency": level.concurrency,
                "path": level.path,
                "median": {k: level.median(k) for k in _KEYS},
                "repeats": level.repeats,
            }
            for level in levels
        ],
        "wake_vs_reload": wake,
        "targets": [t.__dict__ | {"passed": t.passed} for t in targets],
    }
    if not args.no_save:
        path = RESULTS_DIR / f"{stamp}-{tag}-llm{'-quick' if args.quick else ''}.json"
        report.write_json(path, document)
        print(f"\nresults: {path.relative_to(REPO_ROOT)} ({document['wall_s']:.0f} s)")
    return 0


class _DirectEngine:
    """The engine called directly: :class:`runtimes.llm.hf_engine.HFEngine` in this process
    (no server, no engine process, no HTTP), its updates handed to the event loop."""

    def __init__(self, engine: HFEngine, tokenizer: Any) -> None:
        self._engine = engine
        self.tokenizer = tokenizer
        self._loop = asyncio.get_running_loop()
        self._queues: dict[str, asyncio.Queue[TokenUpdate]] = {}
        self._ids = itertools.count()
        engine.set_sink(self._on_updates)

    @classmethod
    async def load(cls, model_dir: Path) -> _DirectEngine:
        from transformers import AutoTokenizer

        config = model_config.read_config_file(model_dir)
        assert config is not None
        TransformersRuntime.complete_config(model_dir / "1", config)
        parameters = read_parameters(config, OPTIONS)
        tokenizer = AutoTokenizer.from_pretrained(model_dir / "1", local_files_only=True)
        engine = await asyncio.to_thread(HFEngine.load, model_dir / "1", "cpu", parameters)
        return cls(engine, tokenizer)

    def _on_updates(self, updates: list[TokenUpdate]) -> None:
        self._loop.call_soon_threadsafe(self._deliver, updates)

    def _deliver(self, updates: list[TokenUpdate]) -> None:
        for update in updates:
            queue = self._queues.get(update.request_id)
            if queue is not None:
                queue.put_nowait(update)

    async def generate(
        self, prompt_ids: list[int], max_tokens: int
    ) -> AsyncGenerator[tuple[int, ...], None]:
        """Greedy; yields the new token ids of each step."""
        request_id = f"bench-{next(self._ids)}"
        queue: asyncio.Queue[TokenUpdate] = asyncio.Queue()
        self._queues[request_id] = queue
        try:
            self._engine.add(
                request_id, prompt_ids, max_new_tokens=max_tokens, temperature=0.0, top_p=1.0
            )
            while True:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    update = await queue.get()
                if update.error is not None:
                    raise RuntimeError(f"the engine failed: {update.error}")
                if update.tokens:
                    yield update.tokens
                if update.is_finished:
                    return
        finally:
            del self._queues[request_id]

    async def text(self, text: str, max_tokens: int) -> str:
        prompt_ids = self.tokenizer.encode(text)
        tokens = [t async for step in self.generate(prompt_ids, max_tokens) for t in step]
        # The server's detokenizer, so that the texts compare exactly.
        detokenizer = IncrementalDetokenizer(self.tokenizer, prompt_ids)
        return detokenizer.add(tokens) + detokenizer.flush()

    async def close(self) -> None:
        await asyncio.to_thread(self._engine.close)


async def _run(
    args: argparse.Namespace, model_dir: Path, platform: PlatformProcess, worker: dict[str, Any]
) -> list[_Level]:
    engine = await _DirectEngine.load(model_dir)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    url = f"http://127.0.0.1:{platform.port}"
    try:
        async with (
            httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits) as http,
            httpx.AsyncClient(
                base_url=str(worker["url"]), timeout=REQUEST_TIMEOUT_S, limits=limits
            ) as worker_http,
        ):
            await _check_same_text(engine, http)
            return await _measure(
                args, engine, http, worker_http, platform, int(worker["details"]["pid"])
            )
    finally:
        await engine.close()


async def _check_same_text(engine: _DirectEngine, http: httpx.AsyncClient) -> None:
    """Both paths give the same greedy text before anything is timed."""
    text = " ".join(WORDS[:8])
    direct = await engine.text(text, 16)
    response = await http.post(
        "/v1/completions", json={"model": MODEL, "prompt": text, "max_tokens": 16, "temperature": 0}
    )
    response.raise_for_status()
    served = response.json()["choices"][0]["text"]
    if served != direct:
        raise RuntimeError(f"the activator's text {served!r} differs from the engine's")
    print(f"verified: {MODEL} gives the same greedy text directly and through the activator")


async def _measure(
    args: argparse.Namespace,
    engine: _DirectEngine,
    http: httpx.AsyncClient,
    worker_http: httpx.AsyncClient,
    platform: PlatformProcess,
    worker_pid: int,
) -> list[_Level]:
    levels = {(c, p): _Level(c, p) for c in args.levels for p in PATHS}
    rng = random.Random(args.seed)
    for repeat in range(args.repeats):
        for index, concurrency in enumerate(args.levels):
            prompts = [
                " ".join(rng.choice(WORDS) for _ in range(args.prompt_words))
                for _ in range(concurrency * args.requests)
            ]
            shift = (index + repeat) % len(PATHS)
            for path in PATHS[shift:] + PATHS[:shift]:
                cpu = (platform.cpu_seconds(), process_tree_cpu_seconds(worker_pid))
                own = time.process_time()
                busy = machine.busy_cpu_seconds()
                began = time.perf_counter()
                if path == ENGINE:
                    samples = await _clients(
                        concurrency, prompts, lambda p: _engine_request(engine, p, args)
                    )
                else:
                    client = http if path == ACTIVATOR else worker_http
                    samples = await _clients(
                        concurrency, prompts, functools.partial(_http_request, client, args=args)
                    )
                wall = time.perf_counter() - began
                record = _summary(samples, wall) | {
                    "platform_cpu_cores": (platform.cpu_seconds() - cpu[0]) / wall,
                    "worker_cpu_cores": (process_tree_cpu_seconds(worker_pid) - cpu[1]) / wall,
                    "bench_cpu_cores": (time.process_time() - own) / wall,
                    "machine_busy_cores": (machine.busy_cpu_seconds() - busy) / wall,
                }
                levels[(concurrency, path)].repeats.append(record)
                print(
                    f"[{repeat + 1}/{args.repeats}] c={concurrency:<3} {path:<9} "
                    f"{record['tokens_per_s']:8.1f} tok/s  TTFT p50 {record['ttft_p50_ms']:7.1f} "
                    f"ms  ITL p50 {record['itl_p50_ms']:6.1f} ms  errors {record['errors']}",
                    file=sys.stderr,
                    flush=True,
                )
    return list(levels.values())


async def _clients(concurrency: int, prompts: list[str], one: Any) -> list[_Sample]:
    """``concurrency`` clients taking the prompts in turn, each request after the last."""
    queue = list(reversed(prompts))
    samples: list[_Sample] = []

    async def client() -> None:
        while queue:
            samples.append(await one(queue.pop()))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return samples


async def _engine_request(engine: _DirectEngine, text: str, args: argparse.Namespace) -> _Sample:
    sample = _Sample()
    started = time.perf_counter()
    last: float | None = None
    stream = engine.generate(engine.tokenizer.encode(text), args.max_tokens)
    async with contextlib.aclosing(stream):
        async for step in stream:
            now = time.perf_counter()
            if last is None:
                sample.first_token_s = now - started
            else:
                sample.gaps_s.append(now - last)
            last = now
            sample.tokens += len(step)
    return sample


async def _http_request(http: httpx.AsyncClient, text: str, args: argparse.Namespace) -> _Sample:
    """One streamed completion, read as raw bytes: events are counted where they arrive and
    only the last one (the usage) is decoded, so that the client takes little of the CPU
    the engine shares with it."""
    sample = _Sample()
    body = {
        "model": MODEL,
        "prompt": text,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    last: float | None = None
    tail = b""
    try:
        async with http.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                sample.error = f"{response.status_code}: {(await response.aread())[:200]!r}"
                return sample
            async for data in response.aiter_raw():
                now = time.perf_counter()
                # A token chunk carries the text of one engine step: one token here (a
                # word-level vocabulary never holds text back). Chunks that arrive together
                # are gaps of 0 between their tokens.
                events = data.count(b'"choices":[{')
                for _ in range(events):
                    if last is None:
                        sample.first_token_s = now - started
                    else:
                        sample.gaps_s.append(now - last)
                    last = now
                tail = (tail + data)[-4096:]
        usage = tail.rsplit(b"data: {", 2)
        if b'"error"' in tail:
            sample.error = tail.decode(errors="replace")[-300:]
        elif len(usage) >= 2 and b'"usage"' in usage[-1]:
            event = b"{" + usage[-1].split(b"\n\n", 1)[0]
            sample.tokens = int(json.loads(event)["usage"]["completion_tokens"])
        else:
            sample.error = "no usage chunk"
    except httpx.HTTPError as exc:
        sample.error = repr(exc)
    return sample


def _summary(samples: list[_Sample], wall: float) -> dict[str, Any]:
    ttft = sorted(s.first_token_s * 1e3 for s in samples if s.first_token_s is not None)
    gaps = sorted(g * 1e3 for s in samples for g in s.gaps_s)
    tokens = sum(s.tokens for s in samples)
    return {
        "requests": len(samples),
        "errors": sum(1 for s in samples if s.error),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "ttft_p50_ms": _quantile(ttft, 0.5),
        "ttft_p90_ms": _quantile(ttft, 0.9),
        "itl_p50_ms": _quantile(gaps, 0.5),
        "itl_p90_ms": _quantile(gaps, 0.9),
        "itl_p99_ms": _quantile(gaps, 0.99),
    }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(int(q * len(values)), len(values) - 1)]


def _wake_vs_reload(
    args: argparse.Namespace, platform: PlatformProcess, model_dir: Path
) -> dict[str, Any]:
    """Sleep/wake against unload/load on the worker's repository API, timed, each followed by
    a greedy request whose text must not change."""
    [worker] = [w for w in platform.workers() if WAKE_MODEL in w["models"]]
    port = int(str(worker["url"]).rsplit(":", 1)[1])
    # As the control plane loads it: from where it was registered, through the node cache.
    load_body = json.dumps({"parameters": {"storage_uri": str(model_dir)}}).encode()
    body = json.dumps(
        {"model": WAKE_MODEL, "prompt": " ".join(WORDS[:8]), "max_tokens": 16, "temperature": 0}
    ).encode()

    def call(action: str) -> float:
        began = time.perf_counter()
        status, _, payload = request(
            port,
            "POST",
            f"/v2/repository/models/{WAKE_MODEL}/{action}",
            body=load_body if action == "load" else b"{}",
            headers={"Content-Type": "application/json"},
            timeout_s=300,
        )
        if status != 200:
            raise RuntimeError(f"{action} answered {status}: {payload[:300]!r}")
        return time.perf_counter() - began

    def answer() -> tuple[str, float]:
        began = time.perf_counter()
        status, _, payload = request(
            port,
            "POST",
            "/v1/completions",
            body=body,
            headers={"Content-Type": "application/json"},
            timeout_s=300,
        )
        if status != 200:
            raise RuntimeError(f"completion answered {status}: {payload[:300]!r}")
        return json.loads(payload)["choices"][0]["text"], time.perf_counter() - began

    reference, _ = answer()
    cycles = []
    for _ in range(args.cycles):
        sleep_s = call("sleep")
        wake_s = call("wake")
        after_wake, first_after_wake_s = answer()
        unload_s = call("unload")
        load_s = call("load")
        after_load, first_after_load_s = answer()
        if after_wake != reference or after_load != reference:
            raise RuntimeError("the greedy text changed after a wake or a reload")
        cycles.append(
            {
                "sleep_s": sleep_s,
                "wake_s": wake_s,
                "first_request_after_wake_s": first_after_wake_s,
                "unload_s": unload_s,
                "reload_s": load_s,
                "first_request_after_reload_s": first_after_load_s,
            }
        )
    medians = {k: statistics.median(c[k] for c in cycles) for k in cycles[0]}
    weights = sum(f.stat().st_size for f in (model_dir / "1").glob("*.safetensors"))
    return {
        "model": f"Llama, random weights, {args.wake_layers} layers, hidden "
        f"{args.wake_hidden}, fp32, {weights / 2**20:.0f} MiB of safetensors",
        "how": "worker repository API (explicit mode): sleep then wake, unload then load "
        "(the model files stay in the node cache: no fetch); same greedy text after each",
        "cycles": cycles,
        "median": medians,
        "reload_over_wake": medians["reload_s"] / medians["wake_s"],
    }


_KEYS: Final = (
    "tokens_per_s",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "itl_p50_ms",
    "itl_p90_ms",
    "itl_p99_ms",
    "errors",
    "platform_cpu_cores",
    "worker_cpu_cores",
    "bench_cpu_cores",
    "machine_busy_cores",
)


def _find(levels: list[_Level], concurrency: int, path: str) -> _Level:
    return next(x for x in levels if x.concurrency == concurrency and x.path == path)


def _targets(levels: list[_Level]) -> list[report.Target]:
    if not any(x.concurrency == TARGET_CONCURRENCY for x in levels):
        return []
    engine = _find(levels, TARGET_CONCURRENCY, ENGINE).median("tokens_per_s")
    through = _find(levels, TARGET_CONCURRENCY, ACTIVATOR).median("tokens_per_s")
    return [
        report.Target(
            "activator_tokens_ratio_at_32",
            f"c={TARGET_CONCURRENCY}: activator tokens/s >= {TARGET_RATIO:.0%} of the engine's",
            through / engine,
            TARGET_RATIO,
            is_max=False,
        )
    ]


def _table(levels: list[_Level], args: argparse.Namespace) -> str:
    header = (
        f"{'c':>4} {'path':<10}{'tok/s':>9}{'ratio':>7}{'TTFT p50':>10}{'TTFT p90':>10}"
        f"{'ITL p50':>9}{'ITL p90':>9}{'ITL p99':>9}{'plat':>6}{'wrk':>6}{'bench':>6}{'errors':>7}"
    )
    lines = [
        "",
        f"{MODEL}: Llama {args.layers} layers, hidden {args.hidden}, CPU; {args.max_tokens} "
        f"tokens per request, greedy; medians of {args.repeats} repeats (ms; cpu in cores)",
        header,
        "-" * len(header),
    ]
    for concurrency in args.levels:
        engine = _find(levels, concurrency, ENGINE).median("tokens_per_s")
        for path in PATHS:
            x = _find(levels, concurrency, path)
            ratio = x.median("tokens_per_s") / engine
            lines.append(
                f"{concurrency:>4} {path:<10}{x.median('tokens_per_s'):>9.1f}{ratio:>7.2f}"
                f"{x.median('ttft_p50_ms'):>10.1f}{x.median('ttft_p90_ms'):>10.1f}"
                f"{x.median('itl_p50_ms'):>9.1f}{x.median('itl_p90_ms'):>9.1f}"
                f"{x.median('itl_p99_ms'):>9.1f}{x.median('platform_cpu_cores'):>6.2f}"
                f"{x.median('worker_cpu_cores'):>6.2f}{x.median('bench_cpu_cores'):>6.2f}"
                f"{sum(int(r['errors']) for r in x.repeats):>7d}"
            )
    lines.append(
        "\nratio: tokens/s over the engine alone's at the same concurrency; plat: the platform "
        "process (control plane + activator); wrk: the worker; bench: this process (the engine "
        "path's engine runs here, the activator path's client too)."
    )
    return "\n".join(lines)


def _wake_text(wake: dict[str, Any]) -> str:
    m = {k: v * 1e3 for k, v in wake["median"].items()}
    return (
        f"\n{wake['model']}:\nwake from sleep {m['wake_s']:.1f} ms vs full reload "
        f"{m['reload_s']:.1f} ms "
        f"({wake['reload_over_wake']:.1f}x); first request after wake "
        f"{m['first_request_after_wake_s']:.1f} ms, after reload "
        f"{m['first_request_after_reload_s']:.1f} ms; sleep took {m['sleep_s']:.1f} ms "
        f"(medians of {len(wake['cycles'])} cycles)"
    )


if __name__ == "__main__":
    sys.exit(main())
