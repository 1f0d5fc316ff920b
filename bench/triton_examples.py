"""Triton's own client examples, run unchanged against ``zeroserve serve``.

    python -m bench.triton_examples /path/to/client/src/python/examples [--json out.json]

``examples`` is the ``src/python/examples`` folder of github triton-inference-server/client
(release r24.10 is what zeroserve is checked with: ``git archive r24.10 src/python/examples``).
Nothing of the examples is copied here: each runs as written, from its own folder, as
``python <example> -u <host:port>``, with a time limit.

The examples expect the models of Triton's test repository. This builds a repository of
eight that answer as theirs do (simple_grpc_model_control checks there are eight):
``simple`` and ``simple_int8`` (INPUT0 + INPUT1, INPUT0 - INPUT1 over 16 elements),
``simple_string`` (the same over numbers written as strings), ``simple_identity`` (strings
back as sent), ``custom_identity_int32``, ``simple_sequence`` (INPUT plus the START flag, as
Triton's sequence test backend answers), ``simple_dyna_sequence`` (that plus the correlation
ID at END), all ONNX, and ``repeat_int32`` (a decoupled Triton Python-backend model that
answers each element of IN after DELAY ms, then waits WAIT ms, as Triton's repeat backend).
One ``zeroserve serve`` serves them in explicit mode with every model loaded, on free
loopback ports; the model-control examples (which unload ``simple``) run last, and
simple_http_model_control, which counts seven models, runs against a second server over the
same models less ``simple_dyna_sequence``.

An example passes when it exits with 0 and prints no ``FAILED``; the table and, with
``--json``, every example's status, time and last lines of output are the result.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Final

import onnx
from onnx import TensorProto, helper

from bench.machine import describe
from bench.server import REPO_ROOT, ServerProcess, free_ports

HOST: Final = "127.0.0.1"
EXAMPLE_TIMEOUT_S: Final = 120.0
TAIL_LINES: Final = 6

LAST: Final = ("simple_grpc_model_control.py",)
"""Examples that unload ``simple``: run after every other."""
SMALLER_REPOSITORY: Final = {"simple_http_model_control.py": "simple_dyna_sequence"}
"""Examples that count one model less than the others, and the model they run without."""

INT32, INT8, STRING = TensorProto.INT32, TensorProto.INT8, TensorProto.STRING


@dataclass(frozen=True)
class Outcome:
    example: str
    passed: bool
    exit_status: int | None
    """None: stopped at the time limit."""
    seconds: float
    tail: str


def _save(graph: onnx.GraphProto, folder: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (folder / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "1" / "model.onnx"))


def _io(kind: str, tensors: Sequence[tuple[str, str, str]]) -> str:
    items = ", ".join(
        f'{{ name: "{name}" data_type: TYPE_{dtype} dims: [ {dims} ] }}'
        for name, dtype, dims in tensors
    )
    return f"{kind} [ {items} ]\n"


def _add_sub(repo: Path, name: str, elem: int, dtype: str, *, strings: bool = False) -> None:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 over [batch, 16]."""
    nodes = []
    a, b = "INPUT0", "INPUT1"
    if strings:
        nodes += [helper.make_node("Cast", ["INPUT0"], ["a"], to=INT32)]
        nodes += [helper.make_node("Cast", ["INPUT1"], ["b"], to=INT32)]
        a, b = "a", "b"
    sums = ("s", "d") if strings else ("OUTPUT0", "OUTPUT1")
    nodes += [
        helper.make_node("Add", [a, b], [sums[0]]),
        helper.make_node("Sub", [a, b], [sums[1]]),
    ]
    if strings:
        nodes += [helper.make_node("Cast", ["s"], ["OUTPUT0"], to=STRING)]
        nodes += [helper.make_node("Cast", ["d"], ["OUTPUT1"], to=STRING)]
    shape: list[str | int | None] = ["batch", 16]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, elem, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, elem, shape) for n in ("OUTPUT0", "OUTPUT1")],
    )
    _save(graph, repo / name)
    tensors = [(n, dtype, "16") for n in ("INPUT0", "INPUT1")]
    outputs = [(n, dtype, "16") for n in ("OUTPUT0", "OUTPUT1")]
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        + _io("input", tensors)
        + _io("output", outputs)
    )


def _identity(repo: Path, name: str, elem: int, dtype: str) -> None:
    shape = ["batch", "n"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        name,
        [helper.make_tensor_value_info("INPUT0", elem, shape)],
        [helper.make_tensor_value_info("OUTPUT0", elem, shape)],
    )
    _save(graph, repo / name)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        + _io("input", [("INPUT0", dtype, "-1")])
        + _io("output", [("OUTPUT0", dtype, "-1")])
    )


def _sequence(repo: Path, name: str, *, dyna: bool) -> None:
    """OUTPUT = INPUT + START (+ END * CORRID for the dyna model), one element a step."""
    controls = [("START", "CONTROL_SEQUENCE_START")]
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["OUTPUT" if not dyna else "t"])]
    if dyna:
        controls += [("END", "CONTROL_SEQUENCE_END")]
        nodes += [
            helper.make_node("Mul", ["END", "CORRID"], ["c"]),
            helper.make_node("Add", ["t", "c"], ["OUTPUT"]),
        ]
    names = ["INPUT", *(control for control, _ in controls)] + (["CORRID"] if dyna else [])
    shape: list[str | int | None] = ["batch", 1]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, INT32, shape) for n in names],
        [helper.make_tensor_value_info("OUTPUT", INT32, shape)],
    )
    _save(graph, repo / name)
    control_text = ", ".join(
        f'{{ name: "{control}" control [ {{ kind: {kind} int32_false_true: [ 0, 1 ] }} ] }}'
        for control, kind in controls
    )
    if dyna:
        control_text += (
            ', { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID '
            "data_type: TYPE_INT32 } ] }"
        )
    strategy = "oldest { max_candidate_sequences: 4 }" if dyna else "direct { }"
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        + _io("input", [("INPUT", "INT32", "1")])
        + _io("output", [("OUTPUT", "INT32", "1")])
        + f"sequence_batching {{ {strategy} control_input [ {control_text} ] }}\n"
    )


REPEAT_MODEL: Final = '''\
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Each element of IN as a response of its own after DELAY[i] ms, then WAIT ms, then
    the final flag."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            inputs = {
                name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                for name in ("IN", "DELAY", "WAIT")
            }
            for index, value in enumerate(inputs["IN"]):
                time.sleep(int(inputs["DELAY"][index]) / 1000)
                out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
                idx = pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out, idx]))
            time.sleep(int(inputs["WAIT"][0]) / 1000)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def _repeat(repo: Path) -> None:
    folder = repo / "repeat_int32"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(REPEAT_MODEL)
    (folder / "config.pbtxt").write_text(
        'name: "repeat_int32"\nbackend: "python"\nmax_batch_size: 0\n'
        "model_transaction_policy { decoupled: true }\n"
        + _io("input", [("IN", "INT32", "-1"), ("DELAY", "UINT32", "-1"), ("WAIT", "UINT32", "1")])
        + _io("output", [("OUT", "INT32", "1"), ("IDX", "UINT32", "1")])
    )


MODELS: Final[dict[str, Callable[[Path, str], None]]] = {
    "simple": lambda repo, name: _add_sub(repo, name, INT32, "INT32"),
    "simple_int8": lambda repo, name: _add_sub(repo, name, INT8, "INT8"),
    "simple_string": lambda repo, name: _add_sub(repo, name, STRING, "STRING", strings=True),
    "simple_identity": lambda repo, name: _identity(repo, name, STRING, "STRING"),
    "custom_identity_int32": lambda repo, name: _identity(repo, name, INT32, "INT32"),
    "simple_sequence": lambda repo, name: _sequence(repo, name, dyna=False),
    "simple_dyna_sequence": lambda repo, name: _sequence(repo, name, dyna=True),
    "repeat_int32": lambda repo, _: _repeat(repo),
}


def build_repository(repo: Path, without: str = "") -> list[str]:
    """The models the examples use (less ``without``) in ``repo``; their names."""
    repo.mkdir(parents=True)
    names = [name for name in MODELS if name != without]
    for name in names:
        MODELS[name](repo, name)
    return names


def examples_in(folder: Path) -> list[str]:
    """Every simple_grpc_* and simple_http_* example, the model-control ones last."""
    names = sorted(p.name for p in folder.glob("simple_*.py") if p.name.startswith(_PREFIXES))
    return [n for n in names if n not in LAST] + [n for n in LAST if n in names]


_PREFIXES: Final = ("simple_grpc_", "simple_http_")


def run_example(folder: Path, example: str, url: str, timeout_s: float) -> Outcome:
    """``python <example> -u <url>`` in ``folder``; its status, time and last lines."""
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, example, "-u", url],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        status: int | None = done.returncode
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        status = None
        output = _text(expired.stdout) + _text(expired.stderr) + f"\n(stopped after {timeout_s} s)"
    seconds = time.monotonic() - start
    tail = "\n".join(output.strip().splitlines()[-TAIL_LINES:])
    passed = status == 0 and "FAILED" not in output
    return Outcome(example, passed, status, round(seconds, 2), tail)


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def serve_command(repo: Path, http_port: int, grpc_port: int) -> list[str]:
    """``zeroserve serve`` over ``repo`` in explicit mode with every model loaded."""
    launcher = "import sys; from zeroserve.cli import main; sys.exit(main())"
    return [
        sys.executable,
        "-c",
        launcher,
        "serve",
        "--model-repository",
        str(repo),
        "--host",
        HOST,
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        "0",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        "--log-level",
        "warning",
    ]


def run_all(folder: Path, work: Path, timeout_s: float) -> list[Outcome]:
    """Every example in ``folder``, against servers built and logged under ``work``."""
    examples = examples_in(folder)
    groups = {"": [e for e in examples if e not in SMALLER_REPOSITORY]}
    for example, without in SMALLER_REPOSITORY.items():
        if example in examples:
            groups.setdefault(without, []).append(example)
    outcomes = []
    for without, members in groups.items():
        tag = f"-without-{without}" if without else ""
        repo = work / f"repo{tag}"
        build_repository(repo, without)
        http_port, grpc_port = free_ports(2)
        command = serve_command(repo, http_port, grpc_port)
        with ServerProcess(command, http_port, work / f"server{tag}.log"):
            for example in members:
                port = grpc_port if example.startswith("simple_grpc_") else http_port
                outcome = run_example(folder, example, f"{HOST}:{port}", timeout_s)
                print(f"{'PASS' if outcome.passed else 'FAIL'}  {example} ({outcome.seconds} s)")
                outcomes.append(outcome)
    return outcomes


def table(outcomes: Sequence[Outcome]) -> str:
    lines = ["| example | result | exit | s | last line |", "|---|---|---|---|---|"]
    for outcome in outcomes:
        last = outcome.tail.splitlines()[-1] if outcome.tail else ""
        exit_status = "timeout" if outcome.exit_status is None else str(outcome.exit_status)
        result = "pass" if outcome.passed else "FAIL"
        last = last.replace("|", "\\|")[:110]
        lines.append(
            f"| {outcome.example} | {result} | {exit_status} | {outcome.seconds} | {last} |"
        )
    passed = sum(outcome.passed for outcome in outcomes)
    lines.append(f"\n{passed} of {len(outcomes)} passed")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("examples", type=Path, help="the client repository's src/python/examples")
    parser.add_argument("--json", type=Path, default=None, help="write the outcomes here")
    parser.add_argument("--timeout", type=float, default=EXAMPLE_TIMEOUT_S, help="per example, s")
    parser.add_argument("--keep", type=Path, default=None, help="build and log here, kept")
    args = parser.parse_args(argv)
    folder: Path = args.examples.resolve()
    if not (folder / "simple_grpc_infer_client.py").is_file():
        print(f"{folder} is not the client repository's src/python/examples", file=sys.stderr)
        return 2
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=False)
        outcomes = run_all(folder, args.keep, args.timeout)
    else:
        with tempfile.TemporaryDirectory(prefix="triton-examples-") as work:
            outcomes = run_all(folder, Path(work), args.timeout)
    print(table(outcomes))
    if args.json is not None:
        result = {
            "examples": str(folder),
            "tritonclient": metadata.version("tritonclient"),
            "passed": sum(outcome.passed for outcome in outcomes),
            "outcomes": [asdict(outcome) for outcome in outcomes],
            "machine": describe(REPO_ROOT, load_generator="Triton's client examples"),
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(outcome.passed for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
