"""``inference.GRPCInferenceService`` on the activator: every RPC answered here or routed to a
replica of the model it names.

- ServerLive, ServerReady and ServerMetadata are the activator's own, as on HTTP: live while
  it runs, ready once it follows the store's placements and until it stops.
- ModelReady answers from the catalog: a registered model is servable through the activator
  even at zero replicas, so it is ready (and asking does not wake it); an unknown one is
  not ready, as Triton's gRPC answers.
- ModelInfer, ModelMetadata, ModelConfig and ModelStatistics go to a replica by the model's
  name (field 1 of each request, read without parsing the rest), the request and answer
  passed through as bytes (:mod:`activator.grpc.unary`); ModelStreamInfer streams through
  (:mod:`activator.grpc.stream`). ModelStatistics without a name (every model's) has no
  one replica to ask and is refused.
- Repository, shared-memory, trace and log RPCs are refused with UNIMPLEMENTED and a
  message saying where the operation lives: models are loaded and unloaded by the control
  plane (its admin API), and shared memory, traces and logs are each worker's.

Handlers take and return bytes (no gRPC (de)serialization); the few messages parsed here
are parsed by this module, so that malformed bytes get Triton's answer (INTERNAL, "Unable
to parse request").
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, NoReturn, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from activator.core import CoreParts
from activator.grpc.channels import WorkerChannels
from activator.grpc.dispatch import SERVICE, Dispatch, WorkerStatusError
from activator.grpc.status import (
    UNPARSABLE_MESSAGE,
    GrpcStatus,
    grpc_status,
)
from activator.grpc.stream import StreamForward, StreamStatusError
from activator.grpc.unary import UnaryForward
from activator.grpc.wire import MalformedMessageError, string_fields
from activator.metadata import EXTENSIONS, SERVER_NAME, server_version
from foundation.proto import grpc_service_pb2 as pb

__all__ = ["GrpcRouter"]

logger = logging.getLogger(__name__)

_M = TypeVar("_M", bound=Message)
_Context = grpc.aio.ServicerContext[bytes, bytes]

_FORWARDED: Final = ("ModelInfer", "ModelMetadata", "ModelConfig", "ModelStatistics")
"""Unary RPCs whose request names the model in field 1, passed to one of its replicas."""

_MODEL_CONTROL = (
    "model control is the control plane's: register, load and unload models through the "
    "admin API (POST /admin/v1/models, /admin/v1/models/<name>/load and /unload)"
)
_SHARED_MEMORY = (
    "shared memory is not available through the activator: regions live on one machine, "
    "and the activator passes tensors in the messages"
)
_WORKER_SETTINGS = "trace and log settings belong to each worker; the activator has none"
_REFUSED: Final = {
    "RepositoryIndex": _MODEL_CONTROL,
    "RepositoryModelLoad": _MODEL_CONTROL,
    "RepositoryModelUnload": _MODEL_CONTROL,
    "SystemSharedMemoryStatus": _SHARED_MEMORY,
    "SystemSharedMemoryRegister": _SHARED_MEMORY,
    "SystemSharedMemoryUnregister": _SHARED_MEMORY,
    "CudaSharedMemoryStatus": _SHARED_MEMORY,
    "CudaSharedMemoryRegister": _SHARED_MEMORY,
    "CudaSharedMemoryUnregister": _SHARED_MEMORY,
    "TraceSetting": _WORKER_SETTINGS,
    "LogSettings": _WORKER_SETTINGS,
}
_ALL_MODELS_STATISTICS = (
    "statistics of every model are not available through the activator: ask for one model "
    "by name (each model's statistics come from one of its replicas)"
)

_Unary = Callable[[bytes, _Context], Awaitable[bytes]]


class GrpcRouter:
    """The activator's gRPC service over the core's parts.

    Parameters:
        parts: the activator's core (table, buffer, view, catalog, traffic...).
        channels: one channel per worker.
    """

    def __init__(self, parts: CoreParts, channels: WorkerChannels) -> None:
        settings = parts.settings
        self._parts = parts
        dispatch = Dispatch(
            parts.catalog,
            parts.table,
            parts.buffer,
            parts.view,
            retry_after_s=settings.retry_after_s,
            read_timeout_s=settings.upstream_read_timeout_s,
            sequences=parts.sequences,
        )
        self._dispatch = dispatch
        self._unary = UnaryForward(
            dispatch, channels, parts.traffic, activation_timeout_s=settings.activation_timeout_s
        )
        self._stream = StreamForward(
            dispatch,
            channels,
            parts.traffic,
            activation_timeout_s=settings.activation_timeout_s,
            max_in_flight=settings.grpc_stream_max_in_flight,
        )

    def handler(self) -> grpc.GenericRpcHandler:
        """The handler of every RPC of the service."""
        return grpc.method_handlers_generic_handler(SERVICE, self.methods())

    def methods(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        """Each RPC's grpc.aio method handler, by method name."""
        methods: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "ServerLive": _unary("ServerLive", self._server_live),
            "ServerReady": _unary("ServerReady", self._server_ready),
            "ServerMetadata": _unary("ServerMetadata", self._server_metadata),
            "ModelReady": _unary("ModelReady", self._model_ready),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self._model_stream_infer),
        }
        for rpc in _FORWARDED:
            methods[rpc] = _unary(rpc, self._forwarder(rpc))
        for rpc, message in _REFUSED.items():
            methods[rpc] = _unary(rpc, _refuser(message))
        return methods

    async def _server_live(self, data: bytes, context: _Context) -> bytes:
        _parse(pb.ServerLiveRequest, data)
        return pb.ServerLiveResponse(live=True).SerializeToString()

    async def _server_ready(self, data: bytes, context: _Context) -> bytes:
        _parse(pb.ServerReadyRequest, data)
        is_ready = self._parts.view.is_synced and not self._parts.lifecycle.is_stopping
        return pb.ServerReadyResponse(ready=is_ready).SerializeToString()

    async def _server_metadata(self, data: bytes, context: _Context) -> bytes:
        _parse(pb.ServerMetadataRequest, data)
        response = pb.ServerMetadataResponse(
            name=SERVER_NAME, version=server_version(), extensions=EXTENSIONS
        )
        return response.SerializeToString()

    async def _model_ready(self, data: bytes, context: _Context) -> bytes:
        request = _parse(pb.ModelReadyRequest, data)
        is_ready = self._parts.catalog.cached(request.name)
        if is_ready is None:
            is_ready = await self._parts.catalog.is_registered(request.name)
        return pb.ModelReadyResponse(ready=is_ready).SerializeToString()

    def _forwarder(self, rpc: str) -> _Unary:
        async def forward(data: bytes, context: _Context) -> bytes:
            try:
                model = string_fields(data, (1,)).get(1, "")
            except MalformedMessageError:
                raise _Refusal(GrpcStatus(grpc.StatusCode.INTERNAL, UNPARSABLE_MESSAGE)) from None
            if rpc == "ModelStatistics" and not model:
                raise _Refusal(GrpcStatus(grpc.StatusCode.UNIMPLEMENTED, _ALL_MODELS_STATISTICS))
            return await self._unary(model, rpc, data, context)

        return forward

    async def _model_stream_infer(
        self, requests: AsyncIterator[bytes], context: _Context
    ) -> AsyncIterator[bytes]:
        try:
            async for data in self._stream.stream(requests, context):
                yield data
        except StreamStatusError as exc:
            await _abort(context, exc.status)
        except Exception as exc:
            await _abort(context, grpc_status(exc, "ModelStreamInfer"))


class _Refusal(Exception):
    """End the call with ``status`` (raised by handlers, turned into the status once)."""

    def __init__(self, status: GrpcStatus) -> None:
        super().__init__(status.message)
        self.status = status


def _parse(message_class: type[_M], data: bytes) -> _M:
    try:
        return message_class.FromString(data)
    except DecodeError:
        raise _Refusal(GrpcStatus(grpc.StatusCode.INTERNAL, UNPARSABLE_MESSAGE)) from None


def _refuser(message: str) -> _Unary:
    async def refuse(data: bytes, context: _Context) -> bytes:
        raise _Refusal(GrpcStatus(grpc.StatusCode.UNIMPLEMENTED, message))

    return refuse


def _unary(rpc: str, method: _Unary) -> grpc.RpcMethodHandler[bytes, bytes]:
    async def handle(data: bytes, context: _Context) -> bytes:
        try:
            return await method(data, context)
        except _Refusal as exc:
            await _abort(context, exc.status)
        except WorkerStatusError as exc:
            await _abort(context, GrpcStatus(exc.code, exc.details, exc.metadata))
        except Exception as exc:
            await _abort(context, grpc_status(exc, rpc))

    return grpc.unary_unary_rpc_method_handler(handle)


async def _abort(context: _Context, status: GrpcStatus) -> NoReturn:
    await context.abort(status.code, status.message, status.metadata)
