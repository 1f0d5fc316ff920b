"""The ``zeroserve bench`` command line, parsed into one immutable :class:`BenchConfig`."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

CLOSED: Final = "concurrency"
OPEN: Final = "rate"
Mode = Literal["concurrency", "rate"]
Transport = Literal["http", "grpc"]
SharedMemory = Literal["none", "system"]
DEFAULT_OUTPUT_SHM_BYTES: Final = 100 * 1024
"""perf_analyzer's ``--output-shared-memory-size`` default: the room for an output whose
size the metadata does not fix (BYTES, or variable dimensions)."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min)?\s*$")
_UNIT_S: Final = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, None: 1.0}


def parse_duration(text: str) -> float:
    """Seconds from ``"10s"``, ``"500ms"``, ``"2m"`` or a bare number of seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 10s, 500ms, 2m)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def parse_levels(text: str) -> tuple[float, ...]:
    """A comma-separated list of positive numbers: ``"1,8,32,64"``."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"needs one or more positive numbers: {text!r}")
    return values


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME:d1,d2`` (perf_analyzer's ``--shape``): the dimensions of one input, batch
    dimension excluded."""
    name, sep, dims = text.rpartition(":")
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(f"not NAME:d1,d2,...: {text!r}")
    return name, shape


def parse_header(text: str) -> tuple[str, str]:
    """``Name: value`` for an extra request header."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip() or "\r" in text or "\n" in text:
        raise argparse.ArgumentTypeError(f"not 'Name: value': {text!r}")
    return name.strip(), value.strip()


@dataclass(frozen=True)
class BenchConfig:
    """Everything one ``zeroserve bench`` run needs; built from the command line or by code."""

    url: str
    """The server's base URL, ``http://host:port`` (a path prefix is kept); with
    ``protocol="grpc"``, its gRPC address, ``host:port`` or ``grpc://host:port``."""
    model: str
    protocol: Transport = "http"
    """``http`` (KServe V2 over HTTP/1.1) or ``grpc`` (Triton's GRPCInferenceService)."""
    shared_memory: SharedMemory = "none"
    """``system``: inputs and outputs travel in POSIX shared-memory regions the run
    registers with the server (which must run on this machine) and unregisters at the end."""
    output_shm_bytes: int = DEFAULT_OUTPUT_SHM_BYTES
    """With ``shared_memory``: bytes set aside per output whose size the metadata leaves
    open."""
    streams_per_connection: int = 8
    """gRPC: calls in flight on one channel (one HTTP/2 connection) at most; a level opens
    as many channels as its concurrency needs."""
    mode: Mode = CLOSED
    levels: tuple[float, ...] = (1.0,)
    """Concurrencies (closed loop) or request rates per second (open loop), in order."""
    duration_s: float = 10.0
    """Timed seconds per level."""
    warmup_s: float = 2.0
    """Untimed seconds of the same load before each level's timed window."""
    model_version: str | None = None
    is_binary: bool = False
    """Send tensors with Triton's binary tensor extension (and ask for binary outputs)."""
    input_data: str = "random"
    """``random``, ``zero``, or a JSON file in the perf_analyzer-like format of
    :mod:`zeroserve.bench.inputs`."""
    batch_size: int = 1
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """Dimensions for inputs whose metadata leaves some variable (``-1``)."""
    is_openai: bool = False
    openai_route: Literal["completions", "chat"] = "completions"
    prompt: str = "The quick brown fox"
    max_tokens: int = 16
    is_stream: bool = False
    """With ``is_openai``: ask for SSE streams and measure TTFT, ITL and tokens/s."""
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 30.0
    """A request not answered after this long counts as a ``timeout`` error."""
    connect_timeout_s: float = 10.0
    setup_timeout_s: float = 30.0
    """For the metadata, config and check requests made before the load starts."""
    max_connections: int = 512
    """Open loop: connections opened at most (a request with none idle waits, its latency
    running); with gRPC, calls in flight at most."""
    seed: int = 0
    json_out: Path | None = None
    plot_out: Path | None = None
    progress: Literal["auto", "bar", "plain", "none"] = "auto"
    argv: tuple[str, ...] = field(default=())
    """The command line, recorded in the JSON output."""


def add_bench_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``zeroserve bench`` on the CLI's subcommands; the caller sets its handler
    (``zeroserve.bench.runner.main``), so that this module need not import the runner."""
    bench = sub.add_parser(
        "bench",
        help="load-test a V2 (Triton/KServe) or OpenAI endpoint, like perf_analyzer",
        description="Closed-loop (--concurrency) or open-loop Poisson (--request-rate) load on "
        "one model; prints throughput, p50/p90/p99 and errors by kind per level.",
    )
    bench.add_argument(
        "url",
        help="server base URL, e.g. http://127.0.0.1:8000; with --protocol grpc its gRPC "
        "address, e.g. 127.0.0.1:8001",
    )
    bench.add_argument("--model", "-m", required=True, help="model name")
    bench.add_argument(
        "--protocol",
        "-i",
        choices=["http", "grpc"],
        default="http",
        help="KServe V2 over HTTP/1.1 (default) or Triton's gRPC service (ModelInfer)",
    )
    bench.add_argument(
        "--shared-memory",
        choices=["none", "system"],
        default="none",
        help="system: inputs and outputs in POSIX shared memory registered with the server "
        "(which must run on this machine); unregistered at the end",
    )
    bench.add_argument(
        "--output-shared-memory-size",
        type=int,
        default=DEFAULT_OUTPUT_SHM_BYTES,
        metavar="BYTES",
        help="with --shared-memory: room per output whose size the metadata leaves open "
        "(BYTES or variable dimensions; 102400)",
    )
    bench.add_argument(
        "--streams-per-connection",
        type=int,
        default=8,
        metavar="N",
        help="gRPC: calls in flight per channel (HTTP/2 connection) at most; channels are "
        "opened as the concurrency needs (8)",
    )
    bench.add_argument("--model-version", default=None, help="V2 model version (default latest)")
    levels = bench.add_mutually_exclusive_group()
    levels.add_argument(
        "--concurrency",
        type=parse_levels,
        default=None,
        metavar="N[,N...]",
        help="closed loop: connections each with one request in flight (default 1)",
    )
    levels.add_argument(
        "--request-rate",
        type=parse_levels,
        default=None,
        metavar="R[,R...]",
        help="open loop: Poisson arrivals per second; latency from the scheduled send time",
    )
    bench.add_argument("--duration", type=parse_duration, default=10.0, help="per level (10s)")
    bench.add_argument("--warmup", type=parse_duration, default=2.0, help="per level (2s)")
    bench.add_argument(
        "--binary", action="store_true", help="Triton binary tensor extension instead of JSON"
    )
    bench.add_argument(
        "--input-data",
        default="random",
        metavar="random|zero|FILE",
        help="input values: random (default), zero, or a JSON file "
        '{"data": [{"INPUT0": [..]}, {"INPUT0": {"content": [..], "shape": [..]}}, ...]}',
    )
    bench.add_argument("--batch-size", "-b", type=int, default=1, help="rows per request (1)")
    bench.add_argument(
        "--shape",
        type=parse_shape,
        action="append",
        default=[],
        metavar="NAME:D1,D2",
        help="dimensions of an input with variable ones, batch excluded (repeatable)",
    )
    bench.add_argument(
        "--openai", action="store_true", help="drive an OpenAI endpoint (/v1/completions)"
    )
    bench.add_argument(
        "--openai-route",
        choices=["completions", "chat"],
        default="completions",
        help="with --openai: /v1/completions or /v1/chat/completions",
    )
    bench.add_argument("--prompt", default="The quick brown fox", help="with --openai")
    bench.add_argument("--max-tokens", type=int, default=16, help="with --openai")
    bench.add_argument(
        "--stream",
        action="store_true",
        help="with --openai: stream (SSE) and report time to first token, inter-token "
        "latency and tokens/s",
    )
    bench.add_argument(
        "--header",
        type=parse_header,
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="extra request header (repeatable), e.g. 'Authorization: Bearer ...'",
    )
    bench.add_argument(
        "--timeout", type=parse_duration, default=30.0, help="per request, then an error (30s)"
    )
    bench.add_argument(
        "--max-connections",
        type=int,
        default=512,
        help="open loop: connections at most; with gRPC, calls in flight at most (512)",
    )
    bench.add_argument("--seed", type=int, default=0, help="seeds random inputs and arrivals")
    bench.add_argument("--json", type=Path, default=None, metavar="OUT", help="write results")
    bench.add_argument(
        "-o",
        "--output",
        choices=["table", "json", "yaml"],
        default="table",
        help="how to print the results: table (for people, the default), or json or yaml (the "
        "document --json writes, for scripts)",
    )
    bench.add_argument(
        "--plot", type=Path, default=None, metavar="OUT.png", help="latency vs throughput PNG"
    )
    bench.add_argument(
        "--progress",
        choices=["auto", "bar", "plain", "none"],
        default="auto",
        help="on stderr: a bar on a terminal, a line per level otherwise (auto)",
    )
    bench.add_argument("--log-level", default="warning", help="how much the process logs")
    return bench


def config_from_args(args: argparse.Namespace, argv: tuple[str, ...] = ()) -> BenchConfig:
    """The :class:`BenchConfig` a parsed ``zeroserve bench`` command line asks for."""
    if args.request_rate is not None:
        mode: Mode = OPEN
        levels: tuple[float, ...] = args.request_rate
    else:
        mode = CLOSED
        levels = args.concurrency or (1.0,)
        if any(level != int(level) for level in levels):
            raise ValueError("--concurrency takes whole numbers")
    if args.duration <= 0 or args.warmup < 0 or args.timeout <= 0:
        raise ValueError("--duration and --timeout must be > 0, --warmup >= 0")
    if args.batch_size < 1 or args.max_connections < 1 or args.max_tokens < 1:
        raise ValueError("--batch-size, --max-connections and --max-tokens must be >= 1")
    if args.openai and args.binary:
        raise ValueError("--binary is for V2 tensors; an OpenAI endpoint takes JSON")
    if args.stream and not args.openai:
        raise ValueError("--stream needs --openai")
    if args.protocol == "grpc" and (args.openai or args.binary or args.header):
        raise ValueError(
            "--protocol grpc sends raw tensor bytes to ModelInfer: --openai, --binary and "
            "--header are for HTTP"
        )
    if args.shared_memory != "none" and args.openai:
        raise ValueError("--shared-memory is for V2 tensors, not an OpenAI endpoint")
    if args.output_shared_memory_size < 1 or args.streams_per_connection < 1:
        raise ValueError("--output-shared-memory-size and --streams-per-connection must be >= 1")
    return BenchConfig(
        url=args.url,
        model=args.model,
        protocol=args.protocol,
        shared_memory=args.shared_memory,
        output_shm_bytes=args.output_shared_memory_size,
        streams_per_connection=args.streams_per_connection,
        mode=mode,
        levels=levels,
        duration_s=args.duration,
        warmup_s=args.warmup,
        model_version=args.model_version,
        is_binary=args.binary,
        input_data=args.input_data,
        batch_size=args.batch_size,
        shapes=tuple(args.shape),
        is_openai=args.openai,
        openai_route=args.openai_route,
        prompt=args.prompt,
        max_tokens=args.max_tokens,
        is_stream=args.stream,
        headers=tuple(args.header),
        timeout_s=args.timeout,
        max_connections=args.max_connections,
        seed=args.seed,
        json_out=args.json,
        plot_out=args.plot,
        progress=args.progress,
        argv=argv,
    )
