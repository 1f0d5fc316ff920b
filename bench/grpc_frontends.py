"""gRPC front ends: zeroserve's gRPC carried by grpc.aio against the h2corn front end
(``--grpc-frontend``), against real Triton 2.51's gRPC, in one run (issue 25).

Three pairs, each the same work on both front ends, and Triton beside the model pair:

* the floor: an echo server answering ModelInfer at once with a fixed response
  (``bench.grpc_echo --frontend aio|h2corn``), no inference, no decoding;
* the light MLP (ONNX Runtime, ``light``) on two ``zeroserve serve`` processes, one per
  front end;
* the same ONNX model inside a ``model.py`` under Triton's contract (``mlp_triton``), on
  both zeroserve processes and on Triton.

The load generator is h2load (one thread, the same pre-encoded request; c=1: one
connection, c=8: one connection of 8 streams, c=64: 8 of 8), after each run the server's
own success count must cover h2load's answers (h2load cannot read gRPC trailers). Server
CPU per call is the CPU of the server's process tree over the run divided by the calls it
counted. Each repeat visits every concurrency with the contenders in a rotated order;
tables give medians. Results go to ``bench/results/<UTC time>-<tag>-grpc_frontends.json``.

    python -m bench.grpc_frontends            # 3 repeats of 5 s points (about 8 minutes)
    python -m bench.grpc_frontends --quick    # 1 repeat of 2 s points
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench import h2load, machine
from bench.grpc_contenders import Contender, Servers, check_answers, start_triton, write_repository
from bench.grpc_echo import run_echo
from bench.grpc_points import Point, measure, save_results, summary
from bench.server import REPO_ROOT, ServerProcess, exit_on_sigterm, free_port, server_command

FRONTENDS: Final = ("aio", "h2corn")
MODELS: Final = ("light", "mlp_triton")

CONTENDERS: Final = (
    Contender("echo_aio", "echo, grpc.aio", "echo", "grpc", "light"),
    Contender("echo_h2corn", "echo, h2corn", "echo_h2corn", "grpc", "light"),
    Contender("zs_aio", "zeroserve ONNX, grpc.aio", "zeroserve", "grpc", "light"),
    Contender("zs_h2corn", "zeroserve ONNX, h2corn", "zeroserve_h2corn", "grpc", "light"),
    Contender("py_aio", "zeroserve model.py, grpc.aio", "zeroserve", "grpc", "mlp_triton"),
    Contender("py_h2corn", "zeroserve model.py, h2corn", "zeroserve_h2corn", "grpc", "mlp_triton"),
    Contender("py_triton", "Triton 2.51 model.py", "triton", "grpc", "mlp_triton"),
)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration-s", type=int, default=5, help="timed seconds per point")
    parser.add_argument("--warmup-s", type=int, default=1, help="untimed seconds before each")
    parser.add_argument("--streams-per-connection", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="1 repeat of 2 s points")
    parser.add_argument("--no-triton", action="store_true", help="leave real Triton out")
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.duration_s, args.warmup_s = 1, 2, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    exit_on_sigterm()
    started_utc = datetime.now(UTC)
    client = h2load.find()
    if client is None:
        raise SystemExit("h2load not found: apt-get install -y nghttp2-client")
    points: list[Point] = []
    failed: list[str] = []
    load_before = machine.load_average()
    with tempfile.TemporaryDirectory(prefix="zeroserve-grpc-frontends-") as folder:
        workdir = Path(folder)
        repository = write_repository(workdir)
        with contextlib.ExitStack() as stack:
            zeroserve: dict[str, tuple[int, str, int]] = {}
            for frontend in FRONTENDS:
                http_port, grpc_port = free_port(), free_port()
                command = server_command(repository, http_port, MODELS)
                command += ["--grpc-port", str(grpc_port), "--grpc-frontend", frontend]
                process = stack.enter_context(
                    ServerProcess(command, http_port, workdir / f"zeroserve-{frontend}.log")
                )
                zeroserve[frontend] = (process.pid, f"127.0.0.1:{grpc_port}", http_port)
            echoes = {}
            for frontend in FRONTENDS:
                port = free_port()
                echo = stack.enter_context(
                    run_echo(port, workdir / f"echo-{frontend}.log", frontend)
                )
                echoes[frontend] = (echo.pid, f"127.0.0.1:{port}")
            triton = start_triton(args, stack, workdir, repository)
            contenders = [c for c in CONTENDERS if triton is not None or c.server != "triton"]
            pid, address, http_port = zeroserve["aio"]
            servers = stack.enter_context(
                Servers(
                    workdir,
                    pid,
                    http_port,
                    address,
                    triton,
                    echoes["aio"],
                    extra={
                        "zeroserve_h2corn": zeroserve["h2corn"][:2],
                        "echo_h2corn": echoes["h2corn"],
                    },
                    contenders=contenders,
                )
            )
            check_answers(servers, contenders)
            print("answers checked against ONNX Runtime; load generator: h2load", flush=True)
            for repeat in range(args.repeats):
                for index, concurrency in enumerate(args.concurrency):
                    turn = (repeat + index) % len(contenders)
                    for contender in contenders[turn:] + contenders[:turn]:
                        try:
                            point = measure(servers, contender, concurrency, repeat, args, client)
                        except RuntimeError as exc:
                            # A point h2load got no answer in (a machine too loaded for
                            # the timed window): recorded, and the run goes on.
                            failed.append(f"repeat {repeat} c={concurrency} {contender.key}: {exc}")
                            print(failed[-1], flush=True)
                            continue
                        points.append(point)
                        print(point.line(), flush=True)
    medians = summary(points)
    text = table(medians, args.concurrency, contenders)
    print(text)
    if not args.no_save:
        path = save_results(
            args,
            started_utc,
            "grpc_frontends",
            "bench.grpc_frontends",
            CONTENDERS,
            h2load.version(client),
            points,
            medians,
            text,
            {"failed_points": failed},
        )
        print(f"results: {path.relative_to(REPO_ROOT)}")
    print(f"load average before {load_before}, after {machine.load_average()}")
    return 0


def table(medians: dict[str, Any], concurrency: list[int], contenders: list[Contender]) -> str:
    """Calls/s and server CPU µs per call for each contender, medians."""
    head = "c=" + " / ".join(str(c) for c in concurrency)
    lines = [
        f"| contender | calls/s {head} | server CPU µs/call {head} |",
        "| --- | --- | --- |",
    ]
    for contender in contenders:
        runs = medians.get(contender.key, {})
        rates = " / ".join(
            f"{runs[str(c)]['infer_per_s']:,.0f}" if str(c) in runs else "-" for c in concurrency
        )
        cpus = " / ".join(
            f"{runs[str(c)]['server_cpu_us']:,.0f}" if str(c) in runs else "-" for c in concurrency
        )
        lines.append(f"| {contender.label} | {rates} | {cpus} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
