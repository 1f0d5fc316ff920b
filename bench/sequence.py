"""A sequence model under 64 concurrent sequences: throughput and latency (p50, p99).

The model is a recurrent cell, ``H' = tanh(X Wx + H Wh + b)`` (64 inputs, 256 hidden units,
ONNX), the shape of a streaming model that carries state from one request of a sequence to
the next. One ``python -m data_plane`` serves it three ways, the same weights under three
names:

- ``direct``: ``sequence_batching`` with the direct strategy, 64 slots (``max_batch_size``
  64), the state ``H`` kept by the server as implicit state;
- ``oldest``: the oldest strategy, 64 candidate sequences, no queue delay;
- ``client_state``: no sequence batcher: dynamic batching (up to 64, no delay), the client
  sends ``H`` with every request and takes the new one from the answer. What a client must
  do without a sequence batcher; the floor the two others are compared with.

Each way runs ``--sequences`` (64) sequences at once, each of ``--steps`` requests sent one
after another on a kept-alive connection of its own (a sequence's next request needs its
previous answer), batch-1 binary requests over HTTP from an asyncio client in this process.
Latency is per request, send to last byte; throughput counts requests (and whole sequences)
per second of the round's wall time. The ways take turns within each of ``--rounds`` rounds,
first way rotating; the figures are medians over rounds. Every way's answers to one
sequence are checked against numpy before anything is timed, and every timed answer must be
a 200. Results, with the machine, go to ``bench/results/<UTC time>-<tag>-sequence.json``.

    python bench/sequence.py           # 3 rounds of 64 sequences x 100 steps per way
    python bench/sequence.py --quick   # 2 rounds of 64 x 10, nothing saved
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

# Run as a script, sys.path[0] is bench/; the repository root must come first so that
# `bench` is a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import onnx
import orjson
from onnx import TensorProto, helper, numpy_helper

from bench import machine
from bench.server import REPO_ROOT, ServerProcess, free_port, server_command

INPUTS: Final = 64
HIDDEN: Final = 256
SLOTS: Final = 64
RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
WAYS: Final = ("direct", "oldest", "client_state")
TIMEOUT_S: Final = 60.0
"""Bound on any one answer."""
ONNX_OPSET: Final = 17
ONNX_IR_VERSION: Final = 8

_SEQUENCE_CONFIG: Final = """
sequence_batching {{
  {strategy}
  max_sequence_idle_microseconds: 60000000
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
  ]
  state [ {{ input_name: "H" output_name: "H_OUT" data_type: TYPE_FP32 dims: [ {hidden} ]
            initial_state {{ data_type: TYPE_FP32 dims: [ {hidden} ] zero_data: true
                            name: "zeros" }} }} ]
}}
"""


@dataclass(frozen=True)
class Weights:
    wx: np.ndarray
    wh: np.ndarray
    bias: np.ndarray

    def step(self, x: np.ndarray, h: np.ndarray) -> np.ndarray:
        result: np.ndarray = np.tanh(x @ self.wx + h @ self.wh + self.bias).astype(np.float32)
        return result


def make_weights(seed: int = 0) -> Weights:
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(HIDDEN)
    return Weights(
        (rng.standard_normal((INPUTS, HIDDEN)) * scale).astype(np.float32),
        (rng.standard_normal((HIDDEN, HIDDEN)) * scale).astype(np.float32),
        (rng.standard_normal(HIDDEN) * 0.1).astype(np.float32),
    )


def write_cell(path: Path, weights: Weights, *, with_controls: bool) -> None:
    """The cell as ONNX; with controls it also takes START and READY (the sequence
    batcher's; the state it resets itself), which the graph does not read."""
    nodes = [
        helper.make_node("MatMul", ["X", "WX"], ["XW"]),
        helper.make_node("MatMul", ["H", "WH"], ["HW"]),
        helper.make_node("Add", ["XW", "HW"], ["S"]),
        helper.make_node("Add", ["S", "B"], ["Z"]),
        helper.make_node("Tanh", ["Z"], ["OUTPUT"]),
    ]
    inputs = [
        helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", INPUTS]),
        helper.make_tensor_value_info("H", TensorProto.FLOAT, ["batch", HIDDEN]),
    ]
    outputs = [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", HIDDEN])]
    if with_controls:
        nodes.append(helper.make_node("Identity", ["OUTPUT"], ["H_OUT"]))
        for name in ("START", "READY"):
            inputs.append(helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 1]))
        outputs.append(helper.make_tensor_value_info("H_OUT", TensorProto.FLOAT, ["batch", HIDDEN]))
    graph = helper.make_graph(
        nodes,
        "cell",
        inputs,
        outputs,
        initializer=[
            numpy_helper.from_array(weights.wx, "WX"),
            numpy_helper.from_array(weights.wh, "WH"),
            numpy_helper.from_array(weights.bias, "B"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = ONNX_IR_VERSION
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def write_repository(root: Path, weights: Weights) -> None:
    """``direct``, ``oldest`` and ``client_state``: the same cell three ways."""
    for way in WAYS:
        sequence = way != "client_state"
        write_cell(root / way / "1" / "model.onnx", weights, with_controls=sequence)
        inputs = f'{{ name: "X" data_type: TYPE_FP32 dims: [ {INPUTS} ] }}'
        if not sequence:
            inputs += f', {{ name: "H" data_type: TYPE_FP32 dims: [ {HIDDEN} ] }}'
        text = (
            f'name: "{way}"\nbackend: "onnxruntime"\nmax_batch_size: {SLOTS}\n'
            f"input [ {inputs} ]\n"
            f'output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {HIDDEN} ] }} ]\n'
            "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        )
        if way == "direct":
            text += _SEQUENCE_CONFIG.format(strategy="direct { }", hidden=HIDDEN)
        elif way == "oldest":
            strategy = f"oldest {{ max_candidate_sequences: {SLOTS} }}"
            text += _SEQUENCE_CONFIG.format(strategy=strategy, hidden=HIDDEN)
        else:
            text += "dynamic_batching { }\n"
        (root / way / "config.pbtxt").write_text(text, encoding="utf-8")


def request_bytes(
    way: str, sequence_id: int, x: np.ndarray, h: np.ndarray | None, flags: dict[str, bool]
) -> bytes:
    """One binary infer request (HTTP/1.1, keep-alive) for ``way``."""
    tensors = [x.astype(np.float32).tobytes()]
    inputs = [
        {
            "name": "X",
            "datatype": "FP32",
            "shape": [1, INPUTS],
            "parameters": {"binary_data_size": len(tensors[0])},
        }
    ]
    if h is not None:
        tensors.append(h.astype(np.float32).tobytes())
        inputs.append(
            {
                "name": "H",
                "datatype": "FP32",
                "shape": [1, HIDDEN],
                "parameters": {"binary_data_size": len(tensors[1])},
            }
        )
    document: dict[str, Any] = {
        "inputs": inputs,
        "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}],
    }
    if way != "client_state":
        document["parameters"] = {"sequence_id": sequence_id, **flags}
    header = orjson.dumps(document)
    body = header + b"".join(tensors)
    head = (
        f"POST /v2/models/{way}/infer HTTP/1.1\r\nHost: bench\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Connection:
    """One kept-alive HTTP/1.1 connection to the server, one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, request: bytes) -> tuple[int, np.ndarray | None]:
        """The answer's status and, for a 200, its OUTPUT."""
        self._writer.write(request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = (line.partition(":") for line in lines[1:] if line)
        headers = {name.strip().lower(): value.strip() for name, _, value in fields}
        body = await self._reader.readexactly(int(headers.get("content-length", "0")))
        if status != 200:
            return status, None
        header_length = int(headers["inference-header-content-length"])
        return status, np.frombuffer(body[header_length:], dtype=np.float32)

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


async def run_sequence(
    port: int, way: str, sequence_id: int, xs: np.ndarray
) -> tuple[list[float], list[np.ndarray]]:
    """One sequence of ``len(xs)`` steps: each step's latency (s) and answer."""
    connection = await Connection.open(port)
    latencies: list[float] = []
    answers: list[np.ndarray] = []
    h = np.zeros(HIDDEN, dtype=np.float32)
    try:
        for step, x in enumerate(xs):
            flags = {}
            if step == 0:
                flags["sequence_start"] = True
            if step == len(xs) - 1:
                flags["sequence_end"] = True
            request = request_bytes(
                way, sequence_id, x, h if way == "client_state" else None, flags
            )
            started = time.perf_counter()
            async with asyncio.timeout(TIMEOUT_S):
                status, output = await connection.send(request)
            latencies.append(time.perf_counter() - started)
            if status != 200 or output is None:
                raise RuntimeError(f"{way}: sequence {sequence_id} step {step} answered {status}")
            h = output
            answers.append(output)
    finally:
        await connection.close()
    return latencies, answers


async def run_way(
    port: int, way: str, inputs: np.ndarray, first_id: int
) -> tuple[list[float], float]:
    """Every sequence of ``inputs`` ([sequences, steps, INPUTS]) at once: the latencies of
    all requests, and the wall time."""
    started = time.perf_counter()
    results = await asyncio.gather(
        *(run_sequence(port, way, first_id + i, xs) for i, xs in enumerate(inputs))
    )
    wall_s = time.perf_counter() - started
    return [latency for latencies, _ in results for latency in latencies], wall_s


def check_answers(port: int, weights: Weights, inputs: np.ndarray) -> None:
    """One sequence per way, its answers against the cell in numpy."""
    expected = []
    h = np.zeros(HIDDEN, dtype=np.float32)
    for x in inputs[0]:
        h = weights.step(x[None, :], h[None, :])[0]
        expected.append(h)
    for index, way in enumerate(WAYS):
        _, answers = asyncio.run(run_sequence(port, way, 10_000_000 + index, inputs[0]))
        np.testing.assert_allclose(np.array(answers), np.array(expected), rtol=1e-4, atol=1e-5)
        print(f"{way}: a sequence's answers checked against numpy")


def summary(latencies: list[float], wall_s: float, sequences: int) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "requests": len(ordered),
        "requests_per_s": len(ordered) / wall_s,
        "sequences_per_s": sequences / wall_s,
        "p50_ms": statistics.median(ordered) * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3,
        "wall_s": wall_s,
    }


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--sequences", type=int, default=SLOTS, help="sequences at once")
    parser.add_argument("--steps", type=int, default=100, help="requests per sequence")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the ways; medians")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 10 steps, no file")
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.no_save = 10, 2, True
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    started_utc = datetime.now(UTC)
    stamp = started_utc.strftime("%Y-%m-%dT%H%M%SZ")
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", args.tag or socket.gethostname()).strip("-") or "host"
    weights = make_weights()
    rng = np.random.default_rng(1)
    inputs = rng.standard_normal((args.sequences, args.steps, INPUTS)).astype(np.float32)
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="zeroserve-sequence-bench-") as folder:
        workdir = Path(folder)
        repository = workdir / "models"
        write_repository(repository, weights)
        port = free_port()
        command = [*server_command(repository, port, list(WAYS)), "--grpc-port", "0"]
        with ServerProcess(command, port, workdir / "server.log") as server:
            check_answers(port, weights, inputs)
            for index in range(args.rounds):
                order = WAYS[index % len(WAYS) :] + WAYS[: index % len(WAYS)]
                measured: dict[str, Any] = {"order": list(order)}
                for way in order:
                    cpu_before = server.cpu_seconds()
                    latencies, wall_s = asyncio.run(
                        run_way(port, way, inputs, first_id=1 + index * args.sequences)
                    )
                    measured[way] = summary(latencies, wall_s, args.sequences)
                    measured[way]["server_cpu_ms_per_request"] = (
                        (server.cpu_seconds() - cpu_before) / len(latencies) * 1e3
                    )
                rounds.append(measured)
                print(
                    f"round {index + 1}: "
                    + ", ".join(
                        f"{way} {measured[way]['requests_per_s']:.0f} req/s "
                        f"p99 {measured[way]['p99_ms']:.2f} ms"
                        for way in WAYS
                    )
                )
    medians = {
        way: {key: statistics.median(r[way][key] for r in rounds) for key in rounds[0][way]}
        for way in WAYS
    }
    description = machine.describe(REPO_ROOT, load_generator="asyncio HTTP/1.1 client in process")
    print()
    print(
        f"machine: {description['cpu_model']}, {description['cpus_usable']} CPUs, "
        f"{args.sequences} sequences x {args.steps} steps, medians of {args.rounds} rounds"
    )
    print("| way | requests/s | sequences/s | p50 ms | p99 ms | server CPU ms/request |")
    print("| --- | --- | --- | --- | --- | --- |")
    for way in WAYS:
        m = medians[way]
        print(
            f"| {way} | {m['requests_per_s']:.0f} | {m['sequences_per_s']:.1f} | "
            f"{m['p50_ms']:.2f} | {m['p99_ms']:.2f} | {m['server_cpu_ms_per_request']:.3f} |"
        )
    if not args.no_save:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{stamp}-{tag}-sequence.json"
        document = {
            "suite": "sequence",
            "started_utc": started_utc.isoformat(),
            "machine": description,
            "command": [sys.executable, *sys.argv],
            "server_command": command,
            "settings": {
                "sequences": args.sequences,
                "steps": args.steps,
                "rounds": args.rounds,
                "inputs": INPUTS,
                "hidden": HIDDEN,
                "slots": SLOTS,
            },
            "rounds": rounds,
            "medians": medians,
        }
        path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
        print(f"results: {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
