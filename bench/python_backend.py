"""Python-backend models: zeroserve's Triton-compatible path against its in-process path and
against real Triton's Python backend (issue 16's benchmark).

The model is the light MLP (``bench.models.MODELS["light"]``, 256->1024->1024->1024->10)
run with ONNX Runtime inside ``model.py``; one ``model.py`` per contract, the same code
otherwise (one session, ONNX Runtime's default threads, the rows of every request of a
batch run together):

(a) ``zeroserve_triton``: Triton's contract (``execute(requests)``), in a zeroserve stub
    process per instance;
(b) ``zeroserve_inprocess``: zeroserve's dict contract (``execute(inputs)``), in the
    server's process;
(c) ``triton``: the same file as (a) in Triton 2.51's Python backend.

Batch-1 JSON requests, closed loop with wrk (one thread; ``--concurrency`` connections),
for each concurrency and each repeat the three run one after the other in a rotated order,
so that drifting machine load hits each the same; the table gives the median of the
repeats. Both servers run together, each idle while the other is measured. Each point
also records the CPU its server spent per request, in the server's own process and in
its children (the stub processes), read from ``/proc`` before and after the run: on a
machine shared with other work the rate swings with the load, the CPU per request much
less, so the second table says where the time goes.

    python -m bench.python_backend --repeats 3 --output bench/results/<UTC>-vm-python_backend.json

Triton's stub runs on the system's Python 3.11 (numpy < 2 visible to it, as
``tests/triton_oracle.py`` arranges) and ignores PYTHONPATH; this script makes the
installed ``onnxruntime`` visible to it with a ``.pth`` file in that Python's
``dist-packages`` naming a folder that holds only a link to the package, removed again
when the run ends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from bench import machine
from bench.models import MODELS, MlpSpec, sample_rows, write_model
from bench.server import (
    ServerProcess,
    children_by_parent,
    free_port,
    process_cpu_seconds,
    server_command,
)
from bench.triton_server import triton_install

SPEC: Final[MlpSpec] = MODELS["light"]
MAX_BATCH_SIZE: Final = 32

TRITON_MODEL: Final = """
import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.session = ort.InferenceSession(
            pb_utils.get_model_dir() + "/model.onnx", providers=["CPUExecutionProvider"]
        )

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        (out,) = self.session.run(None, {"INPUT0": np.concatenate(arrays)})
        responses, start = [], 0
        for array in arrays:
            rows = out[start : start + len(array)]
            start += len(array)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", rows)]))
        return responses
"""

INPROCESS_MODEL: Final = """
from pathlib import Path

import onnxruntime as ort


class TritonPythonModel:
    def initialize(self, args):
        version = Path(args["model_repository"]) / args["model_version"]
        self.session = ort.InferenceSession(
            str(version / "model.onnx"), providers=["CPUExecutionProvider"]
        )

    def execute(self, inputs):
        (out,) = self.session.run(None, {"INPUT0": inputs["INPUT0"]})
        return {"OUTPUT0": out}
"""

CONTENDERS: Final = ("zeroserve_triton", "zeroserve_inprocess", "triton")
_REQUESTS_PER_S: Final = re.compile(r"Requests/sec:\s+([0-9.]+)")
_NON_2XX: Final = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")


def write_repository(root: Path) -> None:
    """``mlp_triton`` (Triton's contract) and ``mlp_inprocess`` (the dict contract)."""
    for name, source in (("mlp_triton", TRITON_MODEL), ("mlp_inprocess", INPROCESS_MODEL)):
        version = root / name / "1"
        version.mkdir(parents=True)
        write_model(SPEC, version / "model.onnx")
        (version / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
            f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {SPEC.input_size} ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {SPEC.output_size} ] }} ]\n'
            "instance_group [ { count: 1 kind: KIND_CPU } ]\ndynamic_batching { }\n"
        )


def request_body() -> bytes:
    row = sample_rows(SPEC, 1)
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [1, SPEC.input_size]}
    return json.dumps({"inputs": [{**tensor, "data": row.reshape(-1).tolist()}]}).encode()


SYSTEM_SITE: Final = Path("/usr/local/lib/python3.11/dist-packages")
"""Where the system Python 3.11, which Triton's stub embeds, reads ``.pth`` files."""


@contextlib.contextmanager
def onnxruntime_for_triton(folder: Path) -> Iterator[None]:
    """Make the installed ``onnxruntime`` importable by Triton's stub while the block runs:
    a folder holding only a link to the package (the rest of this environment would bring
    numpy 2), named by a ``.pth`` file in the system Python's ``dist-packages``."""
    import onnxruntime

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "onnxruntime").symlink_to(Path(onnxruntime.__file__).parent)
    pth = SYSTEM_SITE / f"zeroserve_bench_{os.getpid()}.pth"
    pth.write_text(f"{folder}\n")
    try:
        yield
    finally:
        pth.unlink(missing_ok=True)


def triton_command(root: Path, repository: Path, port: int) -> list[str]:
    """Triton's server, in a clean environment (no virtualenv ahead of the system Python)."""
    return [
        "env",
        "-i",
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"HOME={os.environ.get('HOME', '/root')}",
        str(root / "bin" / "tritonserver"),
        f"--model-repository={repository}",
        f"--backend-directory={root / 'backends'}",
        f"--http-port={port}",
        f"--grpc-port={free_port()}",
        f"--metrics-port={free_port()}",
        "--http-address=127.0.0.1",
        "--model-control-mode=explicit",
        "--load-model=mlp_triton",
        "--log-verbose=0",
    ]


@dataclass(frozen=True)
class Point:
    """One wrk run, and the CPU its server spent per request: in its own process, and in
    its children (the stub processes) together."""

    contender: str
    concurrency: int
    repeat: int
    requests_per_s: float
    load_average: float
    server_cpu_us: float
    stub_cpu_us: float


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds so far of ``pid`` and of its children together (Triton's stubs and
    zeroserve's are children of their server)."""
    children = children_by_parent().get(pid, [])
    total = 0.0
    for child in children:
        with contextlib.suppress(OSError):
            total += process_cpu_seconds(child)
    return process_cpu_seconds(pid), total


def wrk(url: str, body_script: Path, concurrency: int, duration_s: int) -> float:
    """Requests per second of one closed-loop wrk run; raises if any answer was not 200.

    With other work on the machine the rate says little; the CPU the servers spend per
    request (:class:`Point`) moves much less with load."""
    command = [
        "wrk",
        "-t1",
        f"-c{concurrency}",
        f"-d{duration_s}s",
        "-s",
        str(body_script),
        url,
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=duration_s + 60, check=True
    )
    errors = _NON_2XX.search(done.stdout)
    if errors is not None and int(errors.group(1)):
        raise RuntimeError(f"{url}: {errors.group(1)} answers were not 200:\n{done.stdout}")
    found = _REQUESTS_PER_S.search(done.stdout)
    if found is None:
        raise RuntimeError(f"no Requests/sec in wrk's output:\n{done.stdout}\n{done.stderr}")
    return float(found.group(1))


def lua_script(folder: Path, body: bytes) -> Path:
    script = folder / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
    )
    return script


def check_answers(urls: dict[str, str], body: bytes) -> None:
    """Every contender answers the same numbers before anything is timed."""
    import urllib.request

    answers = {}
    for key, url in urls.items():
        request = urllib.request.Request(
            url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answers[key] = np.array(json.load(response)["outputs"][0]["data"])
    first = next(iter(answers.values()))
    for key, answer in answers.items():
        if not np.allclose(answer, first, rtol=1e-4, atol=1e-5):
            raise RuntimeError(f"{key} answered {answer}, others {first}")


@dataclass(frozen=True)
class Contenders:
    """Both servers over one repository (not started), each contender's infer URL, and
    the request body and wrk script every run sends."""

    zeroserve: ServerProcess
    triton: ServerProcess
    urls: dict[str, str]
    body: bytes
    script: Path


def contenders(
    folder: Path,
    triton_root: Path,
    *,
    zeroserve_options: Sequence[str] = (),
    triton_options: Sequence[str] = (),
) -> Contenders:
    """The repository, the servers (with these extra options) and the load, in ``folder``."""
    repository = folder / "repo"
    write_repository(repository)
    body = request_body()
    zs_port, triton_port = free_port(), free_port()
    zeroserve = ServerProcess(
        [
            *server_command(repository, zs_port, ["mlp_triton", "mlp_inprocess"]),
            "--grpc-port",
            "0",
            *zeroserve_options,
        ],
        zs_port,
        folder / "zeroserve.log",
    )
    triton = ServerProcess(
        [*triton_command(triton_root, repository, triton_port), *triton_options],
        triton_port,
        folder / "triton.log",
    )
    urls = {
        "zeroserve_triton": f"http://127.0.0.1:{zs_port}/v2/models/mlp_triton/infer",
        "zeroserve_inprocess": f"http://127.0.0.1:{zs_port}/v2/models/mlp_inprocess/infer",
        "triton": f"http://127.0.0.1:{triton_port}/v2/models/mlp_triton/infer",
    }
    return Contenders(zeroserve, triton, urls, body, lua_script(folder, body))


def run(args: argparse.Namespace) -> list[Point]:
    with tempfile.TemporaryDirectory(prefix="zeroserve-bench-pb-") as tmp:
        folder = Path(tmp)
        servers = contenders(folder, args.triton_root)
        zeroserve, triton, urls = servers.zeroserve, servers.triton, servers.urls
        body, script = servers.body, servers.script
        points: list[Point] = []
        with onnxruntime_for_triton(folder / "ort"), zeroserve, triton:
            check_answers(urls, body)
            for key in CONTENDERS:
                wrk(urls[key], script, 8, args.warmup_s)
            for repeat in range(args.repeats):
                for concurrency in args.concurrency:
                    order = CONTENDERS[repeat % 3 :] + CONTENDERS[: repeat % 3]
                    for key in order:
                        pid = triton.pid if key == "triton" else zeroserve.pid
                        before = cpu_seconds(pid)
                        rate = wrk(urls[key], script, concurrency, args.duration_s)
                        after = cpu_seconds(pid)
                        served = max(rate * args.duration_s, 1.0)
                        point = Point(
                            key,
                            concurrency,
                            repeat,
                            rate,
                            os.getloadavg()[0],
                            1e6 * (after[0] - before[0]) / served,
                            1e6 * (after[1] - before[1]) / served,
                        )
                        points.append(point)
                        print(
                            f"repeat {repeat} c={concurrency:<3} {key:<20} {rate:9.1f} infer/s "
                            f"CPU/request server {point.server_cpu_us:5.0f} us, stubs "
                            f"{point.stub_cpu_us:5.0f} us (load {point.load_average:.2f})",
                            flush=True,
                        )
                        time.sleep(args.pause_s)
        return points


def cpu_table(points: Sequence[Point], concurrency: Sequence[int]) -> str:
    """Medians of the CPU per request, server + stubs, in microseconds."""
    rows = [
        "| c | zeroserve Triton path | zeroserve in-process | Triton |",
        "| --- | --- | --- | --- |",
    ]
    for c in concurrency:
        cells = []
        for key in CONTENDERS:
            chosen = [p for p in points if p.contender == key and p.concurrency == c]
            server = statistics.median(p.server_cpu_us for p in chosen)
            stubs = statistics.median(p.stub_cpu_us for p in chosen)
            cells.append(f"{server:,.0f} + {stubs:,.0f}")
        rows.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def table(points: Sequence[Point], concurrency: Sequence[int]) -> str:
    rows = [
        "| c | zeroserve Triton path | zeroserve in-process | Triton | a/c | b/c |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in concurrency:
        median = {
            key: statistics.median(
                p.requests_per_s for p in points if p.contender == key and p.concurrency == c
            )
            for key in CONTENDERS
        }
        triton = median["triton"]
        rows.append(
            f"| {c} | {median['zeroserve_triton']:,.0f} | {median['zeroserve_inprocess']:,.0f} | "
            f"{triton:,.0f} | {median['zeroserve_triton'] / triton:.2f} | "
            f"{median['zeroserve_inprocess'] / triton:.2f} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    add_run_arguments(parser)
    parser.add_argument("--output", type=Path, help="write every point and the table as JSON")
    args = parser.parse_args(argv)
    if not has_triton(args):
        return 2
    points = run(args)
    text = table(points, args.concurrency)
    cpu = cpu_table(points, args.concurrency)
    print(text)
    print("CPU per request, server + stubs (us):")
    print(cpu)
    if args.output is not None:
        write_output(
            args.output,
            {
                "points": [asdict(p) for p in points],
                "table": text,
                "cpu_table_us": cpu,
                "load_average": [p.load_average for p in points],
                "cpu_count": os.cpu_count(),
            },
        )
    return 0


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every run over :func:`contenders` takes."""
    parser.add_argument(
        "--triton-root",
        type=Path,
        default=None,
        help="the tritonserver folder of an unpacked nvidia-pytriton wheel (bin/, backends/); "
        "default: the one bench.triton_server installs into its cache folder",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration-s", type=int, default=10)
    parser.add_argument("--warmup-s", type=int, default=3)
    parser.add_argument("--pause-s", type=float, default=1.0)


def has_triton(args: argparse.Namespace) -> bool:
    """Whether real Triton can run, ``args.triton_root`` set to it (installed into the
    cache folder when not given); says why not on stderr."""
    if args.triton_root is None:
        install = triton_install()
        if isinstance(install, str):
            print(f"real Triton cannot run here: {install}", file=sys.stderr)
            return False
        args.triton_root = install.binary.parents[1]
    return True


def write_output(path: Path, results: dict[str, Any]) -> None:
    """A run's ``results`` as JSON, with the model and the machine they were taken on."""
    root = Path(__file__).resolve().parents[1]
    machine_now = machine.describe(root, load_generator="wrk")
    path.write_text(
        json.dumps({"model": SPEC.description, **results, "machine": machine_now}, indent=2)
    )


if __name__ == "__main__":
    sys.exit(main())
