"""What a run has ready before its clock starts, whichever the protocol: the load plan of
pre-built requests, what they carry, and the shared-memory regions to release at the end;
and the steps both protocols' preparations share (tensors from the metadata, the regions)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zeroserve.bench import inputs as inputs_module
from zeroserve.bench.args import BenchConfig
from zeroserve.bench.closed_loop import LoadPlan
from zeroserve.bench.grpc_loops import GrpcLoadPlan
from zeroserve.bench.inputs import Tensor
from zeroserve.bench.shared_memory import (
    Registrar,
    SharedMemoryError,
    SharedMemoryRun,
    output_sizes,
)


class BenchError(Exception):
    """The run cannot start or go on: the message says why, for the user."""


@dataclass
class Prepared:
    """A run's requests, built and checked against the server."""

    plan: LoadPlan | GrpcLoadPlan
    path: str
    """The HTTP path, or the gRPC method, the requests go to."""
    request_bytes: int
    """The size of the first request as sent (HTTP head and body, or the message)."""
    inputs: list[dict[str, Any]]
    """Name, datatype and shape of each input of the first request."""
    shared_memory: SharedMemoryRun | None = None
    """The regions the requests name, unregistered and removed by :meth:`close`."""

    def close(self) -> None:
        if self.shared_memory is not None:
            self.shared_memory.close()


def slot_count(config: BenchConfig) -> int:
    """How many requests one level may have in flight at most: its largest concurrency, or
    ``max_connections`` for the open loop (each slot gets its own output window when
    outputs go to shared memory)."""
    if config.mode == "rate":
        return config.max_connections
    return max(int(math.ceil(level)) for level in config.levels)


def model_tensors(
    config: BenchConfig, metadata: Mapping[str, Any], max_batch_size: int | None
) -> tuple[list[list[Tensor]], bool]:
    """Each distinct request's input tensors, as the model's metadata (and the configuration's
    ``max_batch_size`` where the server gives it) and ``config`` ask, and whether the first
    dimension is the batch one; raises :class:`BenchError`."""
    overrides = dict(config.shapes)
    model_config = None if max_batch_size is None else {"max_batch_size": max_batch_size}
    try:
        specs = inputs_module.parse_metadata(metadata)
        unknown = set(overrides) - {s.name for s in specs}
        if unknown:
            raise inputs_module.InputError(f"--shape names unknown inputs: {sorted(unknown)}")
        is_batched = inputs_module.is_batching(specs, model_config)
        if config.input_data in ("random", "zero"):
            requests = [
                inputs_module.generated_tensors(
                    specs,
                    fill=config.input_data,
                    batch_size=config.batch_size,
                    is_batched=is_batched,
                    overrides=overrides,
                    seed=config.seed,
                )
            ]
        else:
            requests = inputs_module.load_input_data(
                Path(config.input_data),
                specs,
                batch_size=config.batch_size,
                is_batched=is_batched,
                overrides=overrides,
            )
    except inputs_module.InputError as exc:
        raise BenchError(str(exc)) from None
    return requests, is_batched


def describe_inputs(tensors: Sequence[Tensor]) -> list[dict[str, Any]]:
    return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in tensors]


def open_shared_memory(
    config: BenchConfig,
    registrar: Registrar,
    metadata: Mapping[str, Any],
    requests: Sequence[Sequence[Tensor]],
    is_batched: bool,
) -> SharedMemoryRun:
    """The run's regions, made and registered (close the result when done); raises
    :class:`BenchError`."""
    try:
        outputs = inputs_module.parse_tensor_specs(metadata, "outputs")
    except inputs_module.InputError as exc:
        raise BenchError(str(exc)) from None
    sizes = output_sizes(
        outputs,
        batch_size=config.batch_size,
        is_batched=is_batched,
        fallback=config.output_shm_bytes,
    )
    try:
        run = SharedMemoryRun(registrar, requests, outputs, sizes, slot_count(config))
        return run.__enter__()
    except SharedMemoryError as exc:
        raise BenchError(f"system shared memory: {exc}") from None
