"""Inference on one loaded model version: validate, batch, execute, pick the outputs.

Transport-free: the HTTP routes decode the wire format into an :class:`InferRequest` and
encode the :class:`OutputTensor` list this returns. Validation texts follow Triton's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping

import numpy as np

from data_plane.errors import (
    InternalError,
    InvalidArgumentError,
    QueueFullError,
    RequestTimeoutError,
    UnavailableError,
    ZeroserveError,
    request_prefix,
)
from data_plane.model_version import Pipeline
from data_plane.protocol import (
    InferInput,
    InferRequest,
    OutputTensor,
    RequestedOutput,
    bind_raw_input,
    classify,
)
from data_plane.repository import LoadedVersion, TensorSpec
from data_plane.response_cache import CacheLookup
from data_plane.response_stream import IDLE_TIMEOUT_S, ResponseStream
from data_plane.sequence import SequenceBatcher
from data_plane.stats import ComputeTimes
from data_plane.trace import RequestTrace, TraceManager
from foundation.datatypes import NUMPY_DTYPES, protocol_from_numpy
from runtimes.model_request import RequestContext


async def infer(
    model: LoadedVersion,
    request: InferRequest,
    tracer: TraceManager | None = None,
    times: ComputeTimes | None = None,
) -> list[OutputTensor]:
    """Run ``request`` on ``model`` and return the outputs it asked for, in order; traced
    when ``tracer`` samples it. ``times``, given, gains the request's compute times (the
    request is an ensemble's step)."""
    ensemble = model.ensemble
    if ensemble is not None:
        return await _infer_ensemble(model, ensemble, request, tracer, times)
    # Triton's clock for statistics and traces (steady_clock is CLOCK_MONOTONIC on Linux).
    started = time.monotonic_ns()
    trace = tracer.sample(model.name) if tracer is not None and tracer.is_active else None
    stats = model.stats
    try:
        batch, rows = _prepare_inputs(model, request)
        reshape = model.reshape
        if reshape is not None:
            batch = reshape.to_model(batch)
        context = None
        as_produced = model.capabilities.requests is not None
        if as_produced:
            context = _request_context(model, request)
        elif isinstance(model.batcher, SequenceBatcher):
            context = _sequence_context(request)
        prepared = time.monotonic_ns()
        cache = model.response_cache
        lookup = None
        if cache is not None:
            lookup = cache.lookup(batch, context)
            if lookup.outputs is not None:
                # A hit never reaches the batcher: the answer is the one cached.
                outputs = _select_outputs(
                    model, request, lookup.outputs, as_produced=context is not None
                )
                _record_hit(model, request, lookup, trace, started=started, prepared=prepared)
                return outputs
        result = await model.batcher.submit(
            batch,
            priority=request.priority,
            timeout_us=request.timeout_us,
            request_id=request.id,
            context=context,
        )
        executed = time.monotonic_ns()
        produced = result.outputs if reshape is None else reshape.from_model(result.outputs)
        if cache is not None and lookup is not None:
            cache.store(lookup, produced)
        outputs = _select_outputs(model, request, produced, as_produced=as_produced)
    except BaseException as exc:
        ended = time.monotonic_ns()
        stats.record_failure(reason=_failure_reason(exc), request_ns=ended - started)
        if trace is not None:
            trace.fail(model, request.id, request_start_ns=started, request_end_ns=ended)
        raise
    finished = time.monotonic_ns()
    stats.record_success(
        rows=rows,
        request_ns=finished - started,
        queue_ns=result.queue_ns,
        input_ns=prepared - started,
        infer_ns=result.compute_ns,
        output_ns=finished - executed,
    )
    if times is not None:
        times.add(
            input_ns=prepared - started, infer_ns=result.compute_ns, output_ns=finished - executed
        )
    if trace is not None:
        trace.finish(
            model,
            request.id,
            request_start_ns=started,
            request_end_ns=finished,
            result=result,
            inputs=batch,
        )
    return outputs


def _record_hit(
    model: LoadedVersion,
    request: InferRequest,
    lookup: CacheLookup,
    trace: RequestTrace | None,
    *,
    started: int,
    prepared: int,
) -> None:
    """Statistics and trace of a request answered from the response cache: Triton counts
    the time to the lookup (the key's hashing) as queueing, and traces no execution."""
    finished = time.monotonic_ns()
    model.stats.record_cache_hit(
        request_ns=finished - started,
        queue_ns=lookup.start_ns - prepared,
        lookup_ns=lookup.lookup_ns,
    )
    if trace is not None:
        trace.cached(
            model,
            request.id,
            request_start_ns=started,
            queue_start_ns=prepared,
            request_end_ns=finished,
        )


async def _infer_ensemble(
    model: LoadedVersion,
    ensemble: Pipeline,
    request: InferRequest,
    tracer: TraceManager | None,
    times: ComputeTimes | None,
) -> list[OutputTensor]:
    """An ensemble's request: checked as any request, run through the steps (each an
    :func:`infer` of its own), its outputs picked. As in Triton, the ensemble's compute
    times are the sums of its steps'."""
    started = time.monotonic_ns()
    steps = ComputeTimes()
    try:
        batch, rows = _prepare_inputs(model, request)
        for requested in request.outputs or ():
            if requested.name not in model.outputs:
                # Checked before any step runs; Triton's text has no request id here.
                raise InvalidArgumentError(
                    f"unexpected inference output '{requested.name}' for model '{model.name}'"
                )
        reshape = model.reshape
        if reshape is not None:
            batch = reshape.to_model(batch)
        prepared = time.monotonic_ns()
        produced = await ensemble.run(
            batch, request, lambda step, sent, into: infer(step, sent, tracer, into), steps
        )
        if reshape is not None:
            produced = reshape.from_model(produced)
        outputs = _select_outputs(model, request, produced)
    except BaseException as exc:
        _record_ensemble_failure(model, exc, started)
        raise
    _record_ensemble_success(model, rows, steps, started=started, prepared=prepared)
    if times is not None:
        times.add(input_ns=steps.input_ns, infer_ns=steps.infer_ns, output_ns=steps.output_ns)
    return outputs


def _record_ensemble_success(
    model: LoadedVersion, rows: int, steps: ComputeTimes, *, started: int, prepared: int
) -> None:
    """An ensemble request's statistics: as in Triton, its compute times are the sums of
    its steps'."""
    model.stats.record_composed(
        rows=rows,
        request_ns=time.monotonic_ns() - started,
        queue_ns=prepared - started,
        times=steps,
    )


def _record_ensemble_failure(model: LoadedVersion, error: BaseException, started: int) -> None:
    reason = "CANCELED" if isinstance(error, asyncio.CancelledError) else "OTHER"
    model.stats.record_failure(reason=reason, request_ns=time.monotonic_ns() - started)


def _failure_reason(error: BaseException) -> str:
    """Triton's ``reason`` for a failed request."""
    if isinstance(error, asyncio.CancelledError):
        return "CANCELED"
    if isinstance(error, QueueFullError | RequestTimeoutError):
        return "REJECTED"
    if isinstance(error, InvalidArgumentError | UnavailableError):
        return "OTHER"
    return "BACKEND"


def _prepare_inputs(
    model: LoadedVersion, request: InferRequest
) -> tuple[dict[str, np.ndarray], int]:
    """Check the inputs against the config; return them by name and the batch size."""
    prefix = request_prefix(request.id)
    name = model.name
    inputs = request.inputs
    if len(inputs) == 1 and inputs[0].datatype == "":
        inputs = [_raw_input(model, inputs[0], request.id)]
    given: dict[str, InferInput] = {}
    for tensor in inputs:
        if tensor.name not in model.inputs:
            raise InvalidArgumentError(
                f"{prefix}unexpected inference input '{tensor.name}' for model '{name}'"
            )
        given[tensor.name] = tensor
    missing = [n for n, spec in model.inputs.items() if n not in given and not spec.optional]
    if missing:
        raise InvalidArgumentError(
            f"{prefix}expected {len(model.inputs)} inputs but got {len(given)} inputs for model "
            f"'{name}'. Got input(s) {sorted(given)}, but missing required input(s) "
            f"{missing}. Please provide all required input(s)."
        )
    batching = model.max_batch_size > 0
    rows = 1
    batch: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(given.values()):
        spec = model.inputs[tensor.name]
        if tensor.datatype != spec.datatype:
            raise InvalidArgumentError(
                f"{prefix}inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                f"but model '{name}' expects '{spec.datatype}'"
            )
        shape = tensor.shape
        if batching:
            if not shape:
                raise InvalidArgumentError(
                    f"{prefix}input '{tensor.name}' has no shape but model requires batch "
                    f"dimension for '{name}'"
                )
            if index == 0:
                rows = shape[0]
            elif shape[0] != rows:
                raise InvalidArgumentError(
                    f"{prefix}input '{tensor.name}' batch size does not match other inputs "
                    f"for '{name}'"
                )
            if rows > model.max_batch_size:
                raise InvalidArgumentError(
                    f"{prefix}inference request batch-size must be <= {model.max_batch_size} "
                    f"for '{name}'"
                )
            if rows < 1:
                raise InvalidArgumentError(
                    f"{prefix}inference request batch-size must be >= 1 for '{name}'"
                )
            _check_dims(spec, shape[1:], shape, prefix, name, batching=True)
        else:
            _check_dims(spec, shape, shape, prefix, name, batching=False)
        batch[tensor.name] = tensor.data
    return batch, rows


def _check_dims(
    spec: TensorSpec,
    dims: tuple[int, ...],
    shape: tuple[int, ...],
    prefix: str,
    model: str,
    *,
    batching: bool,
) -> None:
    expected = spec.dims
    if len(dims) == len(expected) and all(
        e in (-1, d) for e, d in zip(expected, dims, strict=True)
    ):
        return
    shown = ([-1] if batching else []) + list(expected)
    note = (
        " NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
        "dimension to be prepended to each input shape. If you want to specify the full shape "
        "including the batch dim in your input dims config, try setting max_batch_size to zero. "
        "See the model configuration docs for allowed inference request shapes."
        if batching
        else ""
    )
    raise InvalidArgumentError(
        f"{prefix}unexpected shape for input '{spec.name}' for model '{model}'. Expected "
        f"{_dims_text(shown)}, got {_dims_text(list(shape))}.{note}"
    )


def _dims_text(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _raw_input(model: LoadedVersion, raw: InferInput, request_id: str | None) -> InferInput:
    """A raw binary body (header length 0) is the model's only input, batch 1 if batching."""
    if len(model.inputs) != 1:
        raise InvalidArgumentError(
            f"{request_prefix(request_id)}Raw request must only have 1 input (found 1) to be "
            f"deduced but got {len(model.inputs)} inputs in '{model.name}' model configuration"
        )
    spec = next(iter(model.inputs.values()))
    return bind_raw_input(
        raw,
        model=model.name,
        name=spec.name,
        datatype=spec.datatype,
        dims=spec.dims,
        max_batch_size=model.max_batch_size,
        request_id=request_id,
    )


_RESERVED_PARAMETERS = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output")
)
"""Request parameters Triton turns into request fields and keeps from the model."""


def _request_context(model: LoadedVersion, request: InferRequest) -> RequestContext:
    """What a model that takes requests one by one learns of ``request`` besides its
    tensors, as Triton's Python backend tells it."""
    if request.outputs is None:
        requested = tuple(model.outputs)
    else:
        requested = tuple(o.name for o in request.outputs)
        for name in requested:
            if name not in model.outputs:
                # Triton's text for these models, which carries no request id.
                raise InvalidArgumentError(
                    f"unexpected inference output '{name}' for model '{model.name}'"
                )
    parameters = request.parameters
    correlation_id = parameters.get("sequence_id", 0)
    flags = _sequence_flags(parameters)
    return RequestContext(
        request_id=request.id or "",
        correlation_id=correlation_id if isinstance(correlation_id, int | str) else 0,
        parameters={k: v for k, v in parameters.items() if k not in _RESERVED_PARAMETERS},
        requested_outputs=requested,
        flags=flags,
    )


def _sequence_context(request: InferRequest) -> RequestContext:
    """What a sequence model's batcher needs of a request its engine takes merged: the
    correlation ID and the START/END flags."""
    parameters = request.parameters
    correlation_id = parameters.get("sequence_id", 0)
    return RequestContext(
        request_id=request.id or "",
        correlation_id=correlation_id if isinstance(correlation_id, int | str) else 0,
        flags=_sequence_flags(parameters),
    )


def _sequence_flags(parameters: Mapping[str, object]) -> int:
    return (1 if parameters.get("sequence_start") is True else 0) | (
        2 if parameters.get("sequence_end") is True else 0
    )


def _select_outputs(
    model: LoadedVersion,
    request: InferRequest,
    produced: Mapping[str, np.ndarray],
    *,
    as_produced: bool = False,
) -> list[OutputTensor]:
    """The outputs to answer with: those the request names (every configured one when it
    names none), in its order. ``as_produced`` (Triton's Python backend): the ones the
    model produced among them, in its order and with the datatypes it gave them."""
    prefix = request_prefix(request.id)
    raw = bool(request.inputs) and request.inputs[0].datatype == ""
    default_binary = request.binary_data_output or raw
    batching = model.max_batch_size > 0
    selected: list[OutputTensor] = []
    wanted: list[RequestedOutput | None]
    if as_produced:
        by_name = {o.name: o for o in request.outputs} if request.outputs is not None else None
        names = [n for n in produced if n in model.outputs and (by_name is None or n in by_name)]
        wanted = [by_name[n] if by_name is not None else None for n in names]
    elif request.outputs is not None:
        names = [o.name for o in request.outputs]
        wanted = list(request.outputs)
    else:
        names = list(model.outputs)
        wanted = [None] * len(names)
    for name, requested in zip(names, wanted, strict=True):
        spec = model.outputs.get(name)
        if spec is None:
            raise InvalidArgumentError(
                f"{prefix}unexpected inference output '{name}' for model '{model.name}'"
            )
        data = produced.get(name)
        if data is None:
            raise InternalError(f"model '{model.name}' did not produce output '{name}'")
        binary = default_binary
        if requested is not None and requested.binary_data is not None:
            binary = requested.binary_data
        if requested is not None and requested.classification > 0:
            data = classify(data, requested.classification, batching=batching, labels=spec.labels)
            selected.append(OutputTensor(name=name, datatype="BYTES", data=data, binary=binary))
            continue
        if as_produced:
            datatype = protocol_from_numpy(data.dtype)
            selected.append(OutputTensor(name=name, datatype=datatype, data=data, binary=binary))
            continue
        expected = NUMPY_DTYPES[spec.datatype]
        if data.dtype != expected and spec.datatype != "BYTES":
            data = data.astype(expected)
        selected.append(OutputTensor(name=name, datatype=spec.datatype, data=data, binary=binary))
    return selected


def open_stream(
    model: LoadedVersion,
    request: InferRequest,
    *,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
    times: ComputeTimes | None = None,
) -> ResponseStream:
    """The responses of a decoupled model to ``request``, as they come (the request runs
    at the stream's first read). Raises now what the request alone is refused for
    (InvalidArgumentError for inputs or outputs that do not fit the model); the stream
    yields an execution's failure as its last response. ``times``, given, gains the
    request's compute times (the request is an ensemble's step)."""
    if model.ensemble is not None:
        return _open_ensemble_stream(model, model.ensemble, request, idle_timeout_s, times)
    started = time.monotonic_ns()
    batch, rows = _prepare_inputs(model, request)
    context = _request_context(model, request)
    prepared = time.monotonic_ns()

    async def start(streamed: RequestContext) -> None:
        try:
            result = await model.batcher.submit(
                batch,
                priority=request.priority,
                timeout_us=request.timeout_us,
                request_id=request.id,
                context=streamed,
            )
        except BaseException as exc:
            ended = time.monotonic_ns() - started
            model.stats.record_failure(reason=_failure_reason(exc), request_ns=ended)
            raise
        model.stats.record_success(
            rows=rows,
            request_ns=time.monotonic_ns() - started,
            queue_ns=result.queue_ns,
            input_ns=prepared - started,
            infer_ns=result.compute_ns,
            output_ns=0,
        )
        if times is not None:
            times.add(input_ns=prepared - started, infer_ns=result.compute_ns, output_ns=0)

    def select(produced: Mapping[str, np.ndarray]) -> list[OutputTensor]:
        return _select_outputs(model, request, produced, as_produced=True)

    return ResponseStream(model.name, context, start, select, idle_timeout_s=idle_timeout_s)


def _open_ensemble_stream(
    model: LoadedVersion,
    ensemble: Pipeline,
    request: InferRequest,
    idle_timeout_s: float,
    times: ComputeTimes | None,
) -> ResponseStream:
    """A decoupled ensemble's responses: checked as :func:`_infer_ensemble` checks a
    request, each step an :func:`infer` or an :func:`open_stream` of its own, each
    response handed on once the stream has room for it."""
    started = time.monotonic_ns()
    batch, rows = _prepare_inputs(model, request)
    context = _request_context(model, request)
    reshape = model.reshape
    if reshape is not None:
        batch = reshape.to_model(batch)
    prepared = time.monotonic_ns()

    async def start(streamed: RequestContext) -> None:
        sink = streamed.responses
        assert sink is not None
        steps = ComputeTimes()
        responses = ensemble.stream(
            batch,
            request,
            lambda step, sent, into: infer(step, sent, None, into),
            lambda step, sent, into: open_stream(step, sent, times=into),
            steps,
        )
        failed: ZeroserveError | None = None
        try:
            async with contextlib.aclosing(responses):
                async for response in responses:
                    failed = response.error
                    room = asyncio.Event()
                    sink(response, room.set)
                    await room.wait()
        except BaseException as exc:
            _record_ensemble_failure(model, exc, started)
            raise
        if failed is not None:
            _record_ensemble_failure(model, failed, started)
            return
        _record_ensemble_success(model, rows, steps, started=started, prepared=prepared)
        if times is not None:
            times.add(input_ns=steps.input_ns, infer_ns=steps.infer_ns, output_ns=steps.output_ns)

    def select(produced: Mapping[str, np.ndarray]) -> list[OutputTensor]:
        if not produced:
            return []  # a bare final flag
        if reshape is not None:
            produced = reshape.from_model(produced)
        return _select_outputs(model, request, produced)

    return ResponseStream(model.name, context, start, select, idle_timeout_s=idle_timeout_s)


def check_request(model: LoadedVersion, request: InferRequest) -> None:
    """Raise what :func:`infer` would refuse ``request`` for before ``model`` runs it:
    inputs that do not fit, outputs the model does not have (for a caller that must tell
    such refusals from the model's own errors)."""
    _prepare_inputs(model, request)
    if model.capabilities.requests is not None:
        _request_context(model, request)
        return
    for output in request.outputs or ():
        if output.name not in model.outputs:
            raise InvalidArgumentError(
                f"{request_prefix(request.id)}unexpected inference output '{output.name}' "
                f"for model '{model.name}'"
            )
