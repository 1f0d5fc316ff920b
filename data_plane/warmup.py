"""Triton's ``model_warmup``: samples run on every instance of a version before it serves.

Each ``ModelWarmup`` is a request of ``batch_size`` rows (none when 0) whose inputs are
zeros, random values or the bytes of a file in the model's ``warmup/`` folder, run
``count`` times (once when 0) on each instance. :func:`read_samples` builds them from the
config and the model's folder (blocking: run it in a thread) and :func:`run_warmup` runs
them; both raise ModelLoadError with Triton's texts, and the repository fails the load.
Random data is drawn as values (finite numbers, booleans), not as raw bytes as Triton does,
so that a model doing arithmetic on it warms up without overflows; BYTES take empty strings
for zero and random data alike, as in Triton.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_plane.errors import InvalidArgumentError, ModelLoadError, ZeroserveError, request_prefix
from data_plane.instances import Instances
from data_plane.protocol.tensors import decode_binary
from data_plane.reshape import TensorReshape
from foundation import model_config
from foundation.datatypes import ELEMENT_BYTES, NUMPY_DTYPES, protocol_from_config
from foundation.proto.model_config_pb2 import ModelConfig, ModelWarmup
from runtimes.model_request import ModelRequest, RequestContext

WARMUP_FOLDER = "warmup"
"""Where ``input_data_file`` names its files: a folder of the model's folder (Triton's)."""

_PREFIX = request_prefix(None)


@dataclass(frozen=True)
class WarmupSample:
    """One ``ModelWarmup``, ready to run: its inputs as a client would send them."""

    name: str
    inputs: dict[str, np.ndarray]
    rows: int
    """The batch size: rows of each input (1 for a model that does not batch)."""
    count: int


def _invalid(model: str, message: str) -> ModelLoadError:
    return ModelLoadError(model=model, reason=f"Invalid argument: {message}")


def read_samples(config: ModelConfig, model_dir: Path) -> list[WarmupSample]:
    """The warmup samples of a normalized ``config``, their files read from ``model_dir``.

    A sample of batch size 0 runs nothing and is left out. Warmup inputs the model does
    not have are left out too (Triton does not send them either).
    """
    samples = []
    for warmup in config.model_warmup:
        if warmup.batch_size == 0:
            continue
        samples.append(_sample(config, warmup, model_dir))
    return samples


def _sample(config: ModelConfig, warmup: ModelWarmup, model_dir: Path) -> WarmupSample:
    model = config.name
    is_batched = config.max_batch_size > 0
    if warmup.batch_size > max(config.max_batch_size, 1):
        raise _invalid(
            model,
            f"failed to run warmup sample '{warmup.name}': batch size {warmup.batch_size} for "
            f"'{model}', max allowed is {config.max_batch_size}",
        )
    rows = warmup.batch_size
    specs = {t.name: t for t in config.input}
    inputs: dict[str, np.ndarray] = {}
    for name in sorted(warmup.inputs):
        setting = warmup.inputs[name]
        if -1 in setting.dims:
            raise _invalid(
                model,
                f"{_PREFIX}warmup setting expects all variable-size dimensions are specified "
                f"for input '{name}'",
            )
        choice = setting.WhichOneof("input_data_type")
        if choice is None:
            raise _invalid(
                model, f"{_PREFIX}warmup setting expects input '{name}' to have input_data_type set"
            )
        datatype = protocol_from_config(setting.data_type)
        data = _data(model_dir, setting, datatype, choice)
        spec = specs.get(name)
        if spec is None:
            continue
        expected = protocol_from_config(spec.data_type)
        if datatype != expected:
            raise _invalid(
                model,
                f"{_PREFIX}inference input '{name}' data-type is '{datatype}', but model "
                f"'{model}' expects '{expected}'",
            )
        if is_batched:
            data = np.broadcast_to(data, (rows, *data.shape)).copy()
        _check_shape(model, name, tuple(spec.dims), data.shape, is_batched=is_batched)
        inputs[name] = data
    missing = [t.name for t in config.input if t.name not in inputs and not t.optional]
    if missing:
        raise _invalid(
            model,
            f"{_PREFIX}expected {len(config.input)} inputs but got {len(inputs)} inputs for "
            f"model '{model}'. Got input(s) {sorted(inputs)}, but missing required input(s) "
            f"{missing}. Please provide all required input(s).",
        )
    return WarmupSample(warmup.name, inputs, rows if is_batched else 1, max(warmup.count, 1))


def _data(model_dir: Path, setting: ModelWarmup.Input, datatype: str, choice: str) -> np.ndarray:
    shape = tuple(setting.dims)
    dtype = NUMPY_DTYPES[datatype]
    if datatype == "BYTES" and choice != "input_data_file":
        array = np.empty(shape, dtype=object)
        array.fill(b"")
        return array
    if choice == "zero_data":
        return np.zeros(shape, dtype=dtype)
    if choice == "random_data":
        rng = np.random.default_rng()
        if datatype == "BOOL":
            return rng.integers(0, 2, size=shape).astype(bool)
        if dtype.kind in "iu":
            info = np.iinfo(dtype.str)
            return rng.integers(info.min, info.max, size=shape, dtype=dtype.str, endpoint=True)
        return rng.standard_normal(size=shape).astype(dtype)
    return _file_data(model_dir, setting, datatype, shape)


def _file_data(
    model_dir: Path, setting: ModelWarmup.Input, datatype: str, shape: tuple[int, ...]
) -> np.ndarray:
    model = model_dir.name
    filename = setting.input_data_file
    try:
        model_config.check_file_name(filename, field="input_data_file")
    except model_config.ConfigError:
        raise _invalid(
            model,
            f"'input_data_file' must be the name of a file in the model's {WARMUP_FOLDER} "
            f"folder, not a path: {filename!r}",
        ) from None
    path = model_dir / WARMUP_FOLDER / filename
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(
            model=model,
            reason=f"Internal: failed to open text file for read {path}: {exc.strerror}",
        ) from exc
    if datatype != "BYTES":
        expected = math.prod(shape) * ELEMENT_BYTES[datatype]
        if len(content) < expected:
            # Triton's text, its missing space included.
            raise _invalid(
                model,
                f"{_PREFIX}warmup setting expects {expected} bytes, but the data provided "
                f"from {filename}only has {len(content)} bytes",
            )
        content = content[:expected]
    try:
        return decode_binary(filename, datatype, shape, memoryview(content), model, _PREFIX)
    except InvalidArgumentError as exc:
        raise _invalid(model, exc.message) from exc


def _check_shape(
    model: str, name: str, dims: tuple[int, ...], shape: tuple[int, ...], *, is_batched: bool
) -> None:
    given = shape[1:] if is_batched else shape
    if len(given) == len(dims) and all(d in (-1, g) for d, g in zip(dims, given, strict=True)):
        return
    expected = ([-1] if is_batched else []) + list(dims)
    note = (
        " NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
        "dimension to be prepended to each input shape. If you want to specify the full shape "
        "including the batch dim in your input dims config, try setting max_batch_size to zero. "
        "See the model configuration docs for more info on max_batch_size."
        if is_batched
        else ""
    )
    raise _invalid(
        model,
        f"{_PREFIX}unexpected shape for input '{name}' for model '{model}'. Expected "
        f"{_dims_text(expected)}, got {_dims_text(list(shape))}.{note}",
    )


def _dims_text(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


async def run_warmup(
    samples: list[WarmupSample],
    instances: Instances,
    reshape: TensorReshape | None,
    *,
    model: str,
    outputs: tuple[str, ...],
    timeout_s: float,
) -> None:
    """Run each sample ``count`` times on every instance (as many executions at once as the
    version has instances). An engine that separates requests gets ``rows`` requests of
    one row each, as Triton's Python backend does. Raises ModelLoadError naming the sample
    when an execution fails, or when the whole warmup takes longer than ``timeout_s``."""
    separate = instances.capabilities.requests is not None
    running = ""
    try:
        async with asyncio.timeout(timeout_s):
            for sample in samples:
                running = sample.name
                batch = reshape.to_model(sample.inputs) if reshape is not None else sample.inputs
                for _ in range(sample.count):
                    await asyncio.gather(
                        *(
                            _execute(instances, batch, sample.rows, outputs, separate)
                            for _ in range(instances.count)
                        )
                    )
    except TimeoutError:
        raise ModelLoadError(
            model=model, reason=f"Internal: warmup did not finish within {timeout_s} s"
        ) from None
    except ZeroserveError as exc:
        kind = "Invalid argument" if isinstance(exc, InvalidArgumentError) else "Internal"
        raise ModelLoadError(
            model=model, reason=f"{kind}: failed to run warmup sample '{running}': {exc.message}"
        ) from exc


async def _execute(
    instances: Instances,
    batch: Mapping[str, np.ndarray],
    rows: int,
    outputs: tuple[str, ...],
    separate: bool,
) -> None:
    if not separate:
        await instances.infer(batch)
        return
    context = RequestContext(requested_outputs=outputs)
    if rows > 1:
        requests = [
            ModelRequest({k: v[i : i + 1] for k, v in batch.items()}, context) for i in range(rows)
        ]
    else:
        requests = [ModelRequest(dict(batch), context)]
    for outcome in await instances.execute_requests(requests):
        if isinstance(outcome, ZeroserveError):
            raise outcome
