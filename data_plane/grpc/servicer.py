"""``inference.GRPCInferenceService`` over the data plane's handlers.

Each RPC reads its request message, calls the same handler the HTTP route calls and
encodes the answer; errors become statuses in ``status`` alone. Messages are parsed here
rather than by gRPC so that a malformed one gets Triton's answer (INTERNAL, "Unable to
parse request") instead of gRPC's own.

The shared-memory, trace and log RPCs act on the server's one registry, trace manager and
log control, which its HTTP routes act on too.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import grpc
from google.protobuf.message import Message

from data_plane.errors import NotFoundError, UnknownModelError, UnsupportedError
from data_plane.grpc import messages, settings_rpcs
from data_plane.grpc.codec import (
    decode_infer_request,
    encode_infer_response,
    model_version,
    parse,
)
from data_plane.grpc.status import abort, error_status
from data_plane.grpc.stream import (
    StreamInfer,
    error_response,
    final_response,
    model_error_response,
)
from data_plane.handlers import Handlers
from data_plane.handlers.infer import InferResponse
from foundation.grpc_front.app import CallContext, ClientGoneError, StreamRpc, UnaryRpc
from foundation.grpc_front.wire import RpcStatusError
from foundation.proto import grpc_service_pb2 as pb

SERVICE: Final = "inference.GRPCInferenceService"

_NAMED_REPOSITORY = "'repository_name' specification is not supported"
_DECOUPLED_UNARY: Final = "ModelInfer RPC doesn't support models with decoupled transaction policy"
_EMPTY_FINAL: Final = "triton_enable_empty_final_response"
"""The request parameter asking for a response to a bare final flag."""


class InferenceServicer:
    """The RPCs of ``inference.GRPCInferenceService``, each taking its request message and
    returning its response message (ModelStreamInfer: a stream of each)."""

    def __init__(self, handlers: Handlers, *, stream_max_in_flight: int) -> None:
        self._handlers = handlers
        self._stream = StreamInfer(self._stream_responses, max_in_flight=stream_max_in_flight)

    async def ServerLive(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._handlers.server.live())

    async def ServerReady(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._handlers.server.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        version = model_version(request.version)
        try:
            ready = self._handlers.models.ready(request.name, version)
        except (UnknownModelError, NotFoundError):
            # Triton's gRPC answers "not ready" for a model or version it does not know.
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        return messages.server_metadata(self._handlers.server.metadata())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        meta = self._handlers.models.metadata(request.name, model_version(request.version))
        return messages.model_metadata(meta)

    async def ModelConfig(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        config = self._handlers.models.config(request.name, model_version(request.version))
        return pb.ModelConfigResponse(config=config)

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest
    ) -> pb.ModelStatisticsResponse:
        version = model_version(request.version)
        records = self._handlers.models.stats(request.name or None, version)
        return messages.model_statistics(records)

    async def ModelInfer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        handler = self._handlers.infer
        model = handler.model(request.model_name, model_version(request.model_version))
        handler.check_not_decoupled(model, _DECOUPLED_UNARY)
        response = await handler.infer(model, decode_infer_request(request, model.name))
        return encode_infer_response(response)

    async def _stream_responses(
        self, request: pb.ModelInferRequest
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """A stream's request to its responses: one for a model that is not decoupled,
        each of a decoupled model's, an empty final one only where the request enables
        it, as Triton sends them."""
        handler = self._handlers.infer
        try:
            model = handler.model(request.model_name, model_version(request.model_version))
            decoded = decode_infer_request(request, model.name)
            if not model.config.model_transaction_policy.decoupled:
                response = encode_infer_response(await handler.infer(model, decoded))
                yield final_response(response, is_final=True)
                return
            stream = handler.stream(model, decoded)
        except Exception as exc:
            yield error_response(request, exc)
            return
        empty_final = request.parameters.get(_EMPTY_FINAL)
        is_empty_final_sent = empty_final is not None and empty_final.bool_param
        async with contextlib.aclosing(stream):
            async for answer in stream:
                if answer.error is not None:
                    yield model_error_response(request, model.name, answer.error)
                    return
                if answer.outputs or not answer.is_final:
                    response = encode_infer_response(
                        InferResponse(model.name, str(model.version), request.id, answer.outputs)
                    )
                    yield final_response(response, is_final=answer.is_final)
                elif is_empty_final_sent:
                    empty = pb.ModelInferResponse(id=request.id, model_name=model.name)
                    yield final_response(empty, is_final=True)

    def ModelStreamInfer(
        self, requests: AsyncIterator[bytes]
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        return self._stream.stream(requests)

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest
    ) -> pb.RepositoryIndexResponse:
        if request.repository_name:
            raise UnsupportedError(_NAMED_REPOSITORY)
        entries = await self._handlers.repository.index(ready_only=request.ready)
        return messages.repository_index(entries)

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest
    ) -> pb.RepositoryModelLoadResponse:
        if request.repository_name:
            raise UnsupportedError(_NAMED_REPOSITORY)
        parameters = messages.repository_parameters(request.parameters)
        await self._handlers.repository.load(request.model_name, parameters)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        if request.repository_name:
            raise UnsupportedError(_NAMED_REPOSITORY)
        parameters = messages.repository_parameters(request.parameters)
        await self._handlers.repository.unload(request.model_name, parameters)
        return pb.RepositoryModelUnloadResponse()

    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        regions = self._handlers.shared_memory.system.status(request.name or None)
        return messages.system_shared_memory_status(regions)

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self._handlers.shared_memory.system.register(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self._handlers.shared_memory.system.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest
    ) -> pb.CudaSharedMemoryStatusResponse:
        regions = self._handlers.shared_memory.cuda.status(request.name or None)
        return messages.cuda_shared_memory_status(regions)

    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest
    ) -> pb.CudaSharedMemoryRegisterResponse:
        self._handlers.shared_memory.cuda.register(
            request.name, request.raw_handle, request.device_id, request.byte_size
        )
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self._handlers.shared_memory.cuda.unregister(request.name or None)
        return pb.CudaSharedMemoryUnregisterResponse()

    async def TraceSetting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        handler = self._handlers.trace
        model = request.model_name or None
        handler.check_model(model)  # before the settings are read, as in Triton
        if request.settings:
            values = handler.update(model, settings_rpcs.trace_update(request.settings))
        else:
            values = handler.settings(model)
        return settings_rpcs.trace_response(values)

    async def LogSettings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        control = self._handlers.logging
        if request.settings:
            settings = control.update(settings_rpcs.log_update(request.settings))
        else:
            settings = control.settings()
        return settings_rpcs.log_response(settings)


_UNARY: Final[dict[str, type[Message]]] = {
    "ServerLive": pb.ServerLiveRequest,
    "ServerReady": pb.ServerReadyRequest,
    "ModelReady": pb.ModelReadyRequest,
    "ServerMetadata": pb.ServerMetadataRequest,
    "ModelMetadata": pb.ModelMetadataRequest,
    "ModelConfig": pb.ModelConfigRequest,
    "ModelStatistics": pb.ModelStatisticsRequest,
    "ModelInfer": pb.ModelInferRequest,
    "RepositoryIndex": pb.RepositoryIndexRequest,
    "RepositoryModelLoad": pb.RepositoryModelLoadRequest,
    "RepositoryModelUnload": pb.RepositoryModelUnloadRequest,
    "SystemSharedMemoryStatus": pb.SystemSharedMemoryStatusRequest,
    "SystemSharedMemoryRegister": pb.SystemSharedMemoryRegisterRequest,
    "SystemSharedMemoryUnregister": pb.SystemSharedMemoryUnregisterRequest,
    "CudaSharedMemoryStatus": pb.CudaSharedMemoryStatusRequest,
    "CudaSharedMemoryRegister": pb.CudaSharedMemoryRegisterRequest,
    "CudaSharedMemoryUnregister": pb.CudaSharedMemoryUnregisterRequest,
    "TraceSetting": pb.TraceSettingRequest,
    "LogSettings": pb.LogSettingsRequest,
}
"""Each unary RPC and its request message."""


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def _unary(
    name: str,
    request_class: type[Message],
    method: Callable[[Any], Awaitable[Message]],
) -> grpc.RpcMethodHandler[bytes, Message]:
    async def handle(data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Message:
        try:
            return await method(parse(request_class, data))
        except Exception as exc:
            await abort(context, exc, name)

    return grpc.unary_unary_rpc_method_handler(handle, response_serializer=_serialize)


def _stream(
    name: str, method: Callable[[AsyncIterator[bytes]], AsyncIterator[Message]]
) -> grpc.RpcMethodHandler[bytes, Message]:
    async def handle(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Message]:
        try:
            async for response in method(requests):
                yield response
        except Exception as exc:
            await abort(context, exc, name)

    return grpc.stream_stream_rpc_method_handler(handle, response_serializer=_serialize)


def service_handler(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """The handler serving every RPC of the service with ``servicer``; requests arrive as
    bytes (no request deserializer) and are parsed by :func:`parse`."""
    methods: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: _unary(name, request_class, getattr(servicer, name))
        for name, request_class in _UNARY.items()
    }
    methods["ModelStreamInfer"] = _stream("ModelStreamInfer", servicer.ModelStreamInfer)
    return grpc.method_handlers_generic_handler(SERVICE, methods)


def _status_error(exc: Exception, rpc: str) -> RpcStatusError:
    code, message = error_status(exc, rpc)
    return RpcStatusError(code, message)


def _front_unary(
    name: str, request_class: type[Message], method: Callable[[Any], Awaitable[Message]]
) -> UnaryRpc:
    async def handle(data: bytes, call: CallContext) -> bytes:
        try:
            response = await method(parse(request_class, data))
        except Exception as exc:
            raise _status_error(exc, name) from None
        return response.SerializeToString()

    return UnaryRpc(handle)


def _front_stream(
    name: str, method: Callable[[AsyncIterator[bytes]], AsyncIterator[Message]]
) -> StreamRpc:
    async def handle(requests: AsyncIterator[bytes], call: CallContext) -> AsyncIterator[bytes]:
        try:
            async for response in method(requests):
                yield response.SerializeToString()
        except ClientGoneError:
            raise
        except Exception as exc:
            raise _status_error(exc, name) from None

    return StreamRpc(handle)


def front_rpcs(servicer: InferenceServicer) -> dict[str, UnaryRpc | StreamRpc]:
    """Every RPC of the service for `foundation.grpc_front`, keyed by its path, served by
    ``servicer`` with the statuses :func:`service_handler` gives grpc.aio."""
    rpcs: dict[str, UnaryRpc | StreamRpc] = {
        f"/{SERVICE}/{name}": _front_unary(name, request_class, getattr(servicer, name))
        for name, request_class in _UNARY.items()
    }
    rpcs[f"/{SERVICE}/ModelStreamInfer"] = _front_stream(
        "ModelStreamInfer", servicer.ModelStreamInfer
    )
    return rpcs
