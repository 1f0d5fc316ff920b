"""An ensemble against calling its steps from the client (issue 17's benchmark).

The pipeline: ``pre`` (a Python model: uint8 pixels to floats in [-1, 1)) -> the light
MLP (``bench.models.MODELS["light"]``, 256->1024->1024->1024->10, ONNX Runtime) ->
``post`` (a Python model: softmax and arg-max). Two ways to run it on one ``zeroserve
serve`` process:

``ensemble``
    one request to ``pipeline`` (``platform: "ensemble"``), whose steps pass their arrays
    to one another inside the server;
``client``
    three requests, ``pre``, then ``light``, then ``post``, each sending on the bytes of
    the answer before (the cheapest client there is: binary tensors forwarded without
    decoding).

Every request uses Triton's binary tensor extension on keep-alive HTTP/1.1. The client is
this script's own closed loop (``--concurrency`` connections, each running one pipeline
at a time), the same for both ways, since a chain of requests that depend on the answers
before them is not something a load generator of fixed requests can send. For each
concurrency and repeat the two run one after the other (alternating which goes first);
the table gives the medians of the repeats: pipelines per second and latency percentiles
of a whole pipeline. Both answers are checked equal to numpy's before anything is timed.
The Python models follow zeroserve's dict contract (in the server's process) by default,
or Triton's (a stub process each) with ``--python triton``.

    python -m bench.ensemble
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import numpy as np

from bench import machine
from bench.models import MODELS, MlpSpec, write_model
from bench.server import REPO_ROOT, ServerProcess, free_port, server_command

SPEC: Final[MlpSpec] = MODELS["light"]
MAX_BATCH_SIZE: Final = 32
RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
WAYS: Final = ("ensemble", "client")
TIMEOUT_S: Final = 60.0
"""Bound on any one answer."""

DICT_PRE: Final = """
import numpy as np


class TritonPythonModel:
    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"].astype(np.float32) / 128.0 - 1.0}
"""
DICT_POST: Final = """
import numpy as np


class TritonPythonModel:
    def execute(self, inputs):
        logits = inputs["INPUT0"]
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        return {
            "PROB": (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32),
            "LABEL": logits.argmax(axis=1).astype(np.int64).reshape(-1, 1),
        }
"""
TRITON_PRE: Final = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = x.astype(np.float32) / 128.0 - 1.0
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]))
        return responses
"""
TRITON_POST: Final = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            prob = (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)
            label = logits.argmax(axis=1).astype(np.int64).reshape(-1, 1)
            outputs = [pb_utils.Tensor("PROB", prob), pb_utils.Tensor("LABEL", label)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""


def _python_config(name: str, inputs: str, outputs: str) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        f"input [ {inputs} ]\noutput [ {outputs} ]\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]\ndynamic_batching { }\n"
    )


def write_repository(root: Path, python: str) -> None:
    """``pre``, ``light``, ``post`` and the ``pipeline`` ensemble of the three."""
    pre, post = (DICT_PRE, DICT_POST) if python == "dict" else (TRITON_PRE, TRITON_POST)
    width, classes = SPEC.input_size, SPEC.output_size
    for name, source, inputs, outputs in (
        (
            "pre",
            pre,
            f'{{ name: "INPUT0" data_type: TYPE_UINT8 dims: [ {width} ] }}',
            f'{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {width} ] }}',
        ),
        (
            "post",
            post,
            f'{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {classes} ] }}',
            f'{{ name: "PROB" data_type: TYPE_FP32 dims: [ {classes} ] }}, '
            '{ name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] }',
        ),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(_python_config(name, inputs, outputs))
    write_model(SPEC, root / SPEC.name / "1" / "model.onnx")
    (root / SPEC.name / "config.pbtxt").write_text(
        f'name: "{SPEC.name}"\nbackend: "onnxruntime"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {width} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {classes} ] }} ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\ndynamic_batching { }\n"
    )
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text(
        f'name: "pipeline"\nplatform: "ensemble"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        f'input [ {{ name: "IMAGE" data_type: TYPE_UINT8 dims: [ {width} ] }} ]\n'
        f'output [ {{ name: "PROB" data_type: TYPE_FP32 dims: [ {classes} ] }}, '
        '{ name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
        "ensemble_scheduling {\n"
        '  step { model_name: "pre" model_version: -1 input_map { key: "INPUT0" '
        'value: "IMAGE" } output_map { key: "OUTPUT0" value: "pixels" } }\n'
        f'  step {{ model_name: "{SPEC.name}" model_version: -1 input_map {{ key: "INPUT0" '
        'value: "pixels" } output_map { key: "OUTPUT0" value: "logits" } }\n'
        '  step { model_name: "post" model_version: -1 input_map { key: "INPUT0" '
        'value: "logits" } output_map { key: "PROB" value: "PROB" } '
        'output_map { key: "LABEL" value: "LABEL" } }\n'
        "}\n"
    )


def binary_request(
    host: str,
    model: str,
    name: str,
    datatype: str,
    shape: Sequence[int],
    data: bytes,
    outputs: Sequence[str],
) -> tuple[bytes, bytes]:
    """The head (up to and with the JSON header) of a binary infer request whose tensor
    bytes, ``data``, come next; and the head's second half, which the client keeps to
    build requests that differ only in their data."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": datatype,
                    "shape": list(shape),
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
        },
        separators=(",", ":"),
    ).encode()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(header) + len(data)}\r\n\r\n"
    ).encode()
    return head + header, data


class Connection:
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), TIMEOUT_S
        )
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    async def call(self, head: bytes, data: bytes) -> tuple[bytes, int]:
        """Send a request; its answer's body and its JSON header length."""
        self._writer.write(head + data)
        async with asyncio.timeout(TIMEOUT_S):
            response_head = await self._reader.readuntil(b"\r\n\r\n")
            lines = response_head.decode("latin-1").split("\r\n")
            status = lines[0].split(" ", 2)[1]
            headers = {
                key.strip().lower(): value.strip()
                for key, _, value in (line.partition(":") for line in lines[1:] if line)
            }
            body = await self._reader.readexactly(int(headers["content-length"]))
        if status != "200":
            raise RuntimeError(f"answer {status}: {body[:300]!r}")
        return body, int(headers.get("inference-header-content-length", len(body)))

    def close(self) -> None:
        self._writer.close()


class Pipelines:
    """Runs the pipeline one way on a connection: ``ensemble`` (one request) or
    ``client`` (three, each sending on the bytes of the answer before)."""

    def __init__(self, port: int, image: np.ndarray) -> None:
        host = f"127.0.0.1:{port}"
        width, classes = SPEC.input_size, SPEC.output_size
        pixels = image.tobytes()
        self.ensemble = binary_request(
            host, "pipeline", "IMAGE", "UINT8", (1, width), pixels, ("PROB", "LABEL")
        )
        self.pre = binary_request(host, "pre", "INPUT0", "UINT8", (1, width), pixels, ("OUTPUT0",))
        floats = bytes(4 * width)
        self.light = binary_request(
            host, SPEC.name, "INPUT0", "FP32", (1, width), floats, ("OUTPUT0",)
        )[0]
        self.post = binary_request(
            host, "post", "INPUT0", "FP32", (1, classes), bytes(4 * classes), ("PROB", "LABEL")
        )[0]

    async def run(self, way: str, connection: Connection) -> tuple[bytes, int]:
        if way == "ensemble":
            return await connection.call(*self.ensemble)
        body, header = await connection.call(*self.pre)
        body, header = await connection.call(self.light, body[header:])
        return await connection.call(self.post, body[header:])


def decode(body: bytes, header_length: int) -> dict[str, np.ndarray]:
    """The outputs of a binary answer, by name."""
    header = json.loads(body[:header_length])
    offset, outputs = header_length, {}
    dtypes = {"FP32": np.float32, "INT64": np.int64}
    for output in header["outputs"]:
        size = output["parameters"]["binary_data_size"]
        array = np.frombuffer(body[offset : offset + size], dtypes[output["datatype"]])
        outputs[output["name"]] = array.reshape(output["shape"])
        offset += size
    return outputs


def expected(model: Path, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities and label: the steps in numpy, the MLP in ONNX Runtime."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"INPUT0": image.astype(np.float32) / 128.0 - 1.0})
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True), logits.argmax(axis=1).reshape(-1, 1)


@dataclass(frozen=True)
class Point:
    """One closed-loop run of one way at one concurrency."""

    way: str
    concurrency: int
    repeat: int
    pipelines_per_s: float
    p50_ms: float
    p99_ms: float
    load_average: float


async def closed_loop(
    pipelines: Pipelines, port: int, way: str, concurrency: int, duration_s: float
) -> tuple[float, list[float]]:
    """Pipelines per second and every pipeline's latency (ms) of ``duration_s`` of load."""
    connections = [await Connection.open(port) for _ in range(concurrency)]
    latencies: list[float] = []
    deadline = time.perf_counter() + duration_s

    async def worker(connection: Connection) -> None:
        while (started := time.perf_counter()) < deadline:
            await pipelines.run(way, connection)
            latencies.append((time.perf_counter() - started) * 1e3)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in connections))
    finally:
        for connection in connections:
            connection.close()
    return len(latencies) / (time.perf_counter() - started), latencies


def _check_answers(port: int, pipelines: Pipelines, model: Path, image: np.ndarray) -> None:
    probabilities, label = expected(model, image)

    async def both() -> None:
        connection = await Connection.open(port)
        try:
            for way in WAYS:
                answer = decode(*await pipelines.run(way, connection))
                np.testing.assert_allclose(answer["PROB"], probabilities, rtol=1e-4, atol=1e-6)
                np.testing.assert_array_equal(answer["LABEL"], label)
        finally:
            connection.close()

    asyncio.run(both())


def measure(args: argparse.Namespace) -> list[Point]:
    image = np.random.default_rng(1).integers(0, 256, size=(1, SPEC.input_size), dtype=np.uint8)
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="zeroserve-bench-ensemble-") as tmp:
        folder = Path(tmp)
        write_repository(folder / "repo", args.python)
        port = free_port()
        command = server_command(folder / "repo", port, ["pipeline"])
        with ServerProcess(command, port, folder / "server.log"):
            pipelines = Pipelines(port, image)
            _check_answers(port, pipelines, folder / "repo" / SPEC.name / "1" / "model.onnx", image)
            runner = _event_loop_runner()
            with runner:
                for way in WAYS:
                    runner.run(closed_loop(pipelines, port, way, 8, args.warmup_s))
                for repeat in range(args.repeats):
                    for concurrency in args.concurrency:
                        order = WAYS if repeat % 2 == 0 else WAYS[::-1]
                        for way in order:
                            rate, latencies = runner.run(
                                closed_loop(pipelines, port, way, concurrency, args.duration_s)
                            )
                            p50, p99 = np.percentile(latencies, [50, 99])
                            point = Point(
                                way,
                                concurrency,
                                repeat,
                                rate,
                                float(p50),
                                float(p99),
                                os.getloadavg()[0],
                            )
                            points.append(point)
                            print(
                                f"repeat {repeat} c={concurrency:<3} {way:<9} {rate:8.1f} "
                                f"pipelines/s p50 {p50:6.2f} ms p99 {p99:6.2f} ms "
                                f"(load {point.load_average:.2f})",
                                flush=True,
                            )
                            time.sleep(args.pause_s)
    return points


def _event_loop_runner() -> asyncio.Runner:
    with contextlib.suppress(ImportError):
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    return asyncio.Runner()


def table(points: Sequence[Point], concurrency: Sequence[int]) -> str:
    rows = [
        "| c | ensemble pipelines/s | client pipelines/s | ensemble / client | "
        "ensemble p50 / p99 ms | client p50 / p99 ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in concurrency:

        def median(way: str, field: str, c: int = c) -> float:
            return float(
                statistics.median(
                    getattr(p, field) for p in points if p.way == way and p.concurrency == c
                )
            )

        ensemble, client = (
            median("ensemble", "pipelines_per_s"),
            median("client", "pipelines_per_s"),
        )
        rows.append(
            f"| {c} | {ensemble:,.0f} | {client:,.0f} | {ensemble / client:.2f} | "
            f"{median('ensemble', 'p50_ms'):.2f} / {median('ensemble', 'p99_ms'):.2f} | "
            f"{median('client', 'p50_ms'):.2f} / {median('client', 'p99_ms'):.2f} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--pause-s", type=float, default=1.0)
    parser.add_argument(
        "--python",
        choices=("dict", "triton"),
        default="dict",
        help="the Python models' contract: zeroserve's dict (in process) or Triton's (stubs)",
    )
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.UTC)
    points = measure(args)
    text = table(points, args.concurrency)
    print(text)
    if not args.no_save:
        stamp = started.strftime("%Y-%m-%dT%H%M%SZ")
        tag = args.tag or socket.gethostname()
        path = RESULTS_DIR / f"{stamp}-{tag}-ensemble.json"
        path.write_text(
            json.dumps(
                {
                    "benchmark": "ensemble",
                    "started_utc": started.isoformat(),
                    "model": SPEC.description,
                    "python_contract": args.python,
                    "settings": {
                        k: v for k, v in vars(args).items() if k not in ("tag", "no_save")
                    },
                    "machine": machine.describe(REPO_ROOT, load_generator="bench/ensemble.py"),
                    "points": [asdict(p) for p in points],
                    "table": text,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"results: {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
