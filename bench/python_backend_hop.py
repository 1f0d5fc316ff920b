"""The hop to a Python stub and back, alone: one ``execute`` after another on a stub
process, no HTTP, no batcher, no client (issue 25's look at the stub path at c=1).

Loads a model shaped as Triton's ``add_sub`` example (two 4-element inputs, two
outputs; the model's own work is two numpy operations) into a
:class:`~runtimes.python_backend.runtime.StubRuntime` (one stub), on uvloop as the server
runs, and calls ``execute_requests`` with one request, awaiting
each before the next. Per round it records the wall time per execution and the CPU
spent per execution by this process (the server's side: writing the inputs and the
message, reading the answer) and by the stub (reading the message, building the
``pb_utils`` requests, the model, writing the outputs), the stub's read in nanoseconds
from ``/proc/<pid>/task/*/schedstat``. The CPU per execution is the steadier figure on a
shared machine; the minimum over the rounds steadier still (what the code costs when
nothing else preempts it).

A/B two checkouts by running it alternately with each on ``PYTHONPATH``:

    PYTHONPATH=<checkout> python -m bench.python_backend_hop [--calls 1000 --rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import uvloop

from bench.triton_server import ADD_SUB_MODEL
from foundation import model_config
from runtimes.base import RuntimeOptions
from runtimes.model_request import ModelRequest, RequestContext
from runtimes.python_backend.runtime import StubRuntime
from runtimes.python_model import PythonRuntime

OUTPUTS = ("OUTPUT0", "OUTPUT1")
CONFIG = """name: "add_sub"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
input [ { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` so far, from the scheduler's nanosecond count."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
    return total / 1e9


async def measure(calls: int, rounds: int, warmup: int) -> list[dict[str, float]]:
    """Per round: wall, server CPU and stub CPU per execution, in microseconds."""
    with tempfile.TemporaryDirectory(prefix="zeroserve-bench-hop-") as tmp:
        model_dir = Path(tmp) / "add_sub"
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(CONFIG)
        (model_dir / "1" / "model.py").write_text(ADD_SUB_MODEL)
        config = model_config.read_config_file(model_dir)
        assert config is not None
        PythonRuntime.complete_config(model_dir / "1", config)
        model_config.normalize(config, name=model_dir.name, gpu_count=0)
        runtime = StubRuntime(name=model_dir.name, version=1, options=RuntimeOptions())
        await runtime.load(model_dir / "1", config, "cpu")
        try:
            (stub,) = runtime._stubs
            inputs = {name: np.ones(4, np.float32) for name in ("INPUT0", "INPUT1")}
            requests = [ModelRequest(inputs, RequestContext(requested_outputs=OUTPUTS))]
            for _ in range(warmup):
                await runtime.execute_requests(requests)
            points = []
            for _ in range(rounds):
                server0, stub0 = time.process_time(), cpu_seconds(stub.pid)
                wall0 = time.perf_counter()
                for _ in range(calls):
                    await runtime.execute_requests(requests)
                wall1 = time.perf_counter()
                server1, stub1 = time.process_time(), cpu_seconds(stub.pid)
                points.append(
                    {
                        "wall_us": 1e6 * (wall1 - wall0) / calls,
                        "server_cpu_us": 1e6 * (server1 - server0) / calls,
                        "stub_cpu_us": 1e6 * (stub1 - stub0) / calls,
                    }
                )
            return points
        finally:
            await runtime.unload()


def summary(points: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        statistic: {
            key: round(pick([p[key] for p in points]), 1)
            for key in ("wall_us", "server_cpu_us", "stub_cpu_us")
        }
        for statistic, pick in (("median", statistics.median), ("min", min))
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="executions per round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args(argv)
    points = uvloop.run(measure(args.calls, args.rounds, args.warmup))
    print(json.dumps({**summary(points), "load_average": os.getloadavg()[0]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
