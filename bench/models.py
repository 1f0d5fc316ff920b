"""The benchmark's models: ONNX MLPs generated with a fixed seed, their repository and bodies.

Each MLP is :mod:`data_plane.mlp`'s (the generator of the demo's model and the tests' too):
``Gemm + Relu`` per hidden layer and a final ``Gemm`` (FP32, batch dimension ``batch`` left
dynamic), written with the Triton config the server batches it under.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from data_plane.mlp import (
    INPUT_NAME as INPUT_NAME,
    OUTPUT_NAME as OUTPUT_NAME,
    mlp_weights,
    write_mlp,
)

MAX_BATCH_SIZE: Final = 32
_SEED: Final = 0


@dataclass(frozen=True)
class MlpSpec:
    """One MLP: its name in the repository and its layer widths, input first."""

    name: str
    widths: tuple[int, ...]

    @property
    def input_size(self) -> int:
        return self.widths[0]

    @property
    def output_size(self) -> int:
        return self.widths[-1]

    @property
    def parameter_count(self) -> int:
        return sum(a * b + b for a, b in zip(self.widths, self.widths[1:], strict=False))

    @property
    def description(self) -> str:
        return "->".join(str(w) for w in self.widths)


MODELS: Final = {
    "light": MlpSpec("light", (256, 1024, 1024, 1024, 10)),
    "heavy": MlpSpec("heavy", (1024, 4096, 4096, 4096, 1000)),
}
"""The two MLPs the issue names, by repository name."""


def write_model(spec: MlpSpec, path: Path) -> None:
    """Write ``spec`` as an ONNX model (:mod:`data_plane.mlp`, the same seed every run)."""
    write_mlp(path, mlp_weights(spec.widths, _SEED), name=spec.name)


def config_text(
    spec: MlpSpec,
    *,
    max_queue_delay_us: int,
    intra_op_threads: int | None = None,
    instances: int = 1,
) -> str:
    """The model's ``config.pbtxt``: ONNX Runtime backend, dynamic batching up to 32.

    ``intra_op_threads`` sets the ``intra_op_thread_count`` parameter (Triton's ONNX Runtime
    backend name, which the server reads); None leaves the server's default. ``instances`` is
    the ``instance_group`` count: how many batches may run at once.
    """
    delay = f" max_queue_delay_microseconds: {max_queue_delay_us} " if max_queue_delay_us else " "
    threads = ""
    if intra_op_threads is not None:
        threads = (
            'parameters { key: "intra_op_thread_count" '
            f'value: {{ string_value: "{intra_op_threads}" }} }}\n'
        )
    return (
        f'name: "{spec.name}"\n'
        'backend: "onnxruntime"\n'
        f"max_batch_size: {MAX_BATCH_SIZE}\n"
        f'input [ {{ name: "{INPUT_NAME}" data_type: TYPE_FP32 dims: [ {spec.input_size} ] }} ]\n'
        f'output [ {{ name: "{OUTPUT_NAME}" data_type: TYPE_FP32'
        f" dims: [ {spec.output_size} ] }} ]\n"
        f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
        f"dynamic_batching {{{delay}}}\n"
        f"{threads}"
    )


def write_repository(
    root: Path,
    specs: list[MlpSpec],
    *,
    max_queue_delay_us: int,
    intra_op_threads: int | None = None,
    instances: int = 1,
) -> None:
    """Write a Triton-layout repository: ``<name>/config.pbtxt`` and ``<name>/1/model.onnx``."""
    for spec in specs:
        write_model(spec, root / spec.name / "1" / "model.onnx")
        config = config_text(
            spec,
            max_queue_delay_us=max_queue_delay_us,
            intra_op_threads=intra_op_threads,
            instances=instances,
        )
        (root / spec.name / "config.pbtxt").write_text(config, encoding="utf-8")


def sample_rows(spec: MlpSpec, rows: int) -> np.ndarray:
    """A fixed batch of inputs in [-1, 1), the same on every run."""
    rng = np.random.default_rng([_SEED + 1, spec.input_size, rows])
    return rng.uniform(-1.0, 1.0, size=(rows, spec.input_size)).astype(np.float32)


@dataclass(frozen=True)
class RequestBody:
    """A pre-built infer request: the bytes to post and the headers that go with them."""

    encoding: str
    """``json`` or ``binary`` (Triton's binary tensor extension)."""
    body: bytes
    content_type: str
    header_length: int | None
    """``Inference-Header-Content-Length`` for binary bodies."""


def request_body(spec: MlpSpec, row: np.ndarray, encoding: str) -> RequestBody:
    """A batch-1 request for ``row``, encoded the way ``tritonclient.http`` encodes it."""
    shape = [1, spec.input_size]
    if encoding == "json":
        tensor = {"name": INPUT_NAME, "datatype": "FP32", "shape": shape, "data": row.tolist()}
        text = json.dumps({"inputs": [tensor]}, separators=(",", ":"))
        return RequestBody("json", text.encode(), "application/json", None)
    if encoding == "binary":
        raw = np.ascontiguousarray(row, dtype="<f4").tobytes()
        header = {
            "inputs": [
                {
                    "name": INPUT_NAME,
                    "datatype": "FP32",
                    "shape": shape,
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
        head = json.dumps(header, separators=(",", ":")).encode()
        return RequestBody("binary", head + raw, "application/octet-stream", len(head))
    raise ValueError(f"unknown encoding {encoding!r}")
