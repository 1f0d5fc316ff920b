"""Preparing a gRPC run: the model's metadata and configuration over gRPC, the serialized
``ModelInferRequest`` messages (inputs as ``raw_input_contents``, or placed in shared
memory), and one call made and its answer checked before the clock starts."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.internal.containers import MessageMap

from foundation.proto import grpc_service_pb2 as pb
from zeroserve.bench.args import BenchConfig
from zeroserve.bench.grpc_client import (
    INFER_METHOD,
    GrpcTarget,
    GrpcTargetError,
    SetupClient,
    SetupError,
)
from zeroserve.bench.grpc_loops import GrpcLoadPlan
from zeroserve.bench.inputs import Tensor
from zeroserve.bench.prepared import (
    BenchError,
    Prepared,
    describe_inputs,
    model_tensors,
    open_shared_memory,
)
from zeroserve.bench.shared_memory import PlacedInput, PlacedOutput, Placement


def infer_request(model: str, version: str | None, tensors: Sequence[Tensor]) -> bytes:
    """A ModelInferRequest carrying ``tensors`` as raw contents (every output returned)."""
    request = pb.ModelInferRequest(model_name=model, model_version=version or "")
    for tensor in tensors:
        request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        request.raw_input_contents.append(tensor.raw_bytes())
    return request.SerializeToString()


def shared_memory_request(
    model: str,
    version: str | None,
    inputs: Sequence[PlacedInput],
    outputs: Sequence[PlacedOutput],
) -> bytes:
    """A ModelInferRequest whose inputs are read from, and outputs written to, registered
    regions: no tensor data in the message."""
    request = pb.ModelInferRequest(model_name=model, model_version=version or "")
    for placed in inputs:
        tensor = request.inputs.add(name=placed.name, datatype=placed.datatype)
        tensor.shape.extend(placed.shape)
        _place(tensor.parameters, placed.place)
    for output in outputs:
        _place(request.outputs.add(name=output.name).parameters, output.place)
    return request.SerializeToString()


def _place(parameters: MessageMap[str, pb.InferParameter], place: Placement) -> None:
    parameters["shared_memory_region"].string_param = place.region
    parameters["shared_memory_offset"].int64_param = place.offset
    parameters["shared_memory_byte_size"].int64_param = place.byte_size


def prepare_grpc(config: BenchConfig) -> Prepared:
    """The run's requests, checked against the server; raises :class:`BenchError`."""
    try:
        target = GrpcTarget.parse(config.url)
    except GrpcTargetError as exc:
        raise BenchError(str(exc)) from None
    with SetupClient(target, config.setup_timeout_s) as client:
        try:
            metadata = client.model_metadata(config.model, config.model_version)
            max_batch_size = client.max_batch_size(config.model, config.model_version)
        except SetupError as exc:
            raise BenchError(str(exc)) from None
        tensors, is_batched = model_tensors(config, metadata, max_batch_size)
        if config.shared_memory == "none":
            requests = tuple(infer_request(config.model, config.model_version, t) for t in tensors)
            _check(client, requests[0], has_data=True)
            plan = _plan(config, target, requests)
            return Prepared(plan, INFER_METHOD, len(requests[0]), describe_inputs(tensors[0]))
        registrar = _GrpcRegistrar(target, config.setup_timeout_s)
        shm = open_shared_memory(config, registrar, metadata, tensors, is_batched)
        try:
            layout = shm.layout
            table = tuple(
                tuple(
                    shared_memory_request(config.model, config.model_version, inputs, outputs)
                    for inputs in layout.inputs
                )
                for outputs in layout.outputs
            )
            _check(client, table[0][0], has_data=False)
        except BaseException:
            shm.close()
            raise
    plan = _plan(config, target, table[0], table)
    return Prepared(plan, INFER_METHOD, len(table[0][0]), describe_inputs(tensors[0]), shm)


def _plan(
    config: BenchConfig,
    target: GrpcTarget,
    requests: tuple[bytes, ...],
    slot_requests: tuple[tuple[bytes, ...], ...] = (),
) -> GrpcLoadPlan:
    return GrpcLoadPlan(
        target=target,
        requests=requests,
        warmup_s=config.warmup_s,
        duration_s=config.duration_s,
        timeout_s=config.timeout_s,
        streams_per_connection=config.streams_per_connection,
        batch_size=config.batch_size,
        slot_requests=slot_requests,
    )


def _check(client: SetupClient, request: bytes, *, has_data: bool) -> None:
    """One call before the load: it must succeed with outputs (carrying data unless they
    went to shared memory)."""
    try:
        answer = client.infer(request)
    except SetupError as exc:
        raise BenchError(f"the check call to ModelInfer: {exc}") from None
    if not answer.outputs:
        raise BenchError("the check call to ModelInfer: the answer has no outputs")
    if (
        has_data
        and not answer.raw_output_contents
        and not any(o.HasField("contents") for o in answer.outputs)
    ):
        raise BenchError("the check call to ModelInfer: the answer's outputs carry no data")


class _GrpcRegistrar:
    """Triton's SystemSharedMemory RPCs (:class:`~zeroserve.bench.shared_memory.Registrar`),
    each on a channel of its own so that unregistering works whenever the run ends."""

    def __init__(self, target: GrpcTarget, timeout_s: float) -> None:
        self._target = target
        self._timeout_s = timeout_s

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        with SetupClient(self._target, self._timeout_s) as client:
            client.register(name, key, offset, byte_size)

    def unregister(self, name: str) -> None:
        with SetupClient(self._target, self._timeout_s) as client:
            client.unregister(name)
