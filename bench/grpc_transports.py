"""gRPC benchmark: zeroserve's HTTP against its gRPC against gRPC with system shared memory,
and zeroserve's gRPC against real Triton 2.51's on the same computation (issue 15).

The model is the light MLP (``bench.models.MODELS["light"]``, 256->1024->1024->1024->10),
batch-1 requests, closed loop at concurrency 1, 8 and 64:

* transports, on one ``zeroserve serve`` (ONNX Runtime, dynamic batching, one instance):
  HTTP/1.1 with binary tensors, gRPC ModelInfer with raw contents, and gRPC with the input
  and output in system shared-memory regions the script registers;
* against Triton, whose wheel has only its Python backend: the same ``model.py`` running the
  same ONNX model with ONNX Runtime (``bench.python_backend``'s), served by Triton over gRPC
  and by zeroserve over gRPC, under Triton's contract (a stub process, as in Triton) and
  under zeroserve's in-process contract.
* the floor of zeroserve's gRPC stack: a grpc.aio server on uvloop answering ModelInfer at
  once with a fixed response (``bench.grpc_echo``), no inference.

The load generator is h2load (C, one thread; :mod:`bench.h2load`): the same pre-encoded
request each time, ``-c`` connections of up to ``--streams-per-connection`` streams for
gRPC, one request per connection for HTTP. Before timing, each contender's request is sent
once with a real client and its answer checked against ONNX Runtime (a gRPC call, so its
``grpc-status`` is seen), and after each run the server's own success count must cover
every answer h2load counted (h2load cannot read gRPC trailers). Where h2load is missing the
script says so and uses ``zeroserve bench --protocol grpc`` instead (a Python client, which
then limits the figures on a small machine). With h2load all shared-memory requests name
the same output window, as h2load sends one body; nobody reads it during the timing.

Each repeat visits every concurrency with the contenders in a rotated order, so drifting
machine load hits each alike; the table gives medians over ``--repeats``. Results, with the
machine and its load average, go to ``bench/results/<UTC time>-<tag>-grpc.json``.

    python -m bench.grpc_transports            # 3 repeats of 10 s points (about 12 minutes)
    python -m bench.grpc_transports --quick    # 1 repeat of 2 s points
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

if __name__ == "__main__" and not __package__:
    # Run as a script, sys.path[0] is bench/, where this very file would shadow the grpc
    # package: the repository root takes its place.
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench import h2load
from bench.grpc_contenders import CONTENDERS, Servers, check_answers, start_triton, write_repository
from bench.grpc_echo import run_echo
from bench.grpc_points import Point, measure, save_results, summary, tables, targets
from bench.server import REPO_ROOT, ServerProcess, exit_on_sigterm, free_port, server_command

ZEROSERVE_MODELS: Final = ("light", "mlp_triton", "mlp_inprocess")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration-s", type=int, default=10, help="timed seconds per point")
    parser.add_argument("--warmup-s", type=int, default=2, help="untimed seconds before each")
    parser.add_argument(
        "--streams-per-connection", type=int, default=8, help="gRPC streams per connection"
    )
    parser.add_argument("--quick", action="store_true", help="1 repeat of 2 s points")
    parser.add_argument(
        "--client",
        choices=["auto", "h2load", "zeroserve-bench"],
        default="auto",
        help="load generator: h2load where installed (auto), or zeroserve bench",
    )
    parser.add_argument("--no-triton", action="store_true", help="leave real Triton out")
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.duration_s, args.warmup_s = 1, 2, 1
    return args


def _client(args: argparse.Namespace) -> str | None:
    """h2load's path, or None to use zeroserve bench (saying why)."""
    if args.client == "zeroserve-bench":
        return None
    found = h2load.find()
    if found is None:
        if args.client == "h2load":
            raise SystemExit("h2load not found: apt-get install -y nghttp2-client")
        print(
            "h2load not found (Debian: apt-get install -y nghttp2-client): falling back to "
            "zeroserve bench --protocol grpc, a Python client that on a small machine limits "
            "the figures itself",
            flush=True,
        )
    return found


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    exit_on_sigterm()
    started_utc = datetime.now(UTC)
    client = _client(args)
    client_name = h2load.version(client) if client else "zeroserve bench (in process)"
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="zeroserve-grpc-bench-") as folder:
        workdir = Path(folder)
        repository = write_repository(workdir)
        with contextlib.ExitStack() as stack:
            http_port, grpc_port = free_port(), free_port()
            command = server_command(repository, http_port, ZEROSERVE_MODELS)
            command += ["--grpc-port", str(grpc_port)]
            zeroserve = stack.enter_context(
                ServerProcess(command, http_port, workdir / "zeroserve.log")
            )
            triton = start_triton(args, stack, workdir, repository)
            echo_port = free_port()
            echo = stack.enter_context(run_echo(echo_port, workdir / "echo.log"))
            servers = stack.enter_context(
                Servers(
                    workdir,
                    zeroserve.pid,
                    http_port,
                    f"127.0.0.1:{grpc_port}",
                    triton,
                    (echo.pid, f"127.0.0.1:{echo_port}"),
                )
            )
            triton_address = triton.grpc_address if triton is not None else None
            contenders = [c for c in CONTENDERS if triton_address or c.server != "triton"]
            check_answers(servers, contenders)
            print(f"answers checked against ONNX Runtime; load generator: {client_name}")
            for repeat in range(args.repeats):
                for index, concurrency in enumerate(args.concurrency):
                    turn = (repeat + index) % len(contenders)
                    for contender in contenders[turn:] + contenders[:turn]:
                        point = measure(servers, contender, concurrency, repeat, args, client)
                        points.append(point)
                        print(point.line(), flush=True)
    medians = summary(points)
    text = tables(medians, args.concurrency, has_triton=triton_address is not None)
    print(text)
    judged = targets(medians, args.concurrency)
    for line in judged["lines"]:
        print(line)
    if not args.no_save:
        path = save_results(
            args,
            started_utc,
            "grpc",
            "bench.grpc_transports",
            CONTENDERS,
            client_name,
            points,
            medians,
            text,
            {"zeroserve_command": command, "targets": judged},
        )
        print(f"results: {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
