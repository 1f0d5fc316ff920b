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

from activator.access_log import current_request_id, note_key_id
from activator.core import CoreParts
from activator.errors import UnauthenticatedError
from activator.gate import CURRENT_KEY_ID, Pass
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
from foundation import request_ids
from foundation.errors import ZeroserveError
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
_Keyed = Callable[[bytes, _Context, Pass], Awaitable[bytes]]

_OPEN: Final = ("ServerLive", "ServerReady", "ServerMetadata")
"""RPCs answered without a key, as HTTP's health and metadata paths."""


def _authorization(context: _Context) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


class GrpcRouter:
    """The activator's gRPC service over the core's parts.

    Parameters:
        parts: the activator's core (table, buffer, view, catalog, traffic...).
        channels: one channel per worker.
    """

    def __init__(self, parts: CoreParts, channels: WorkerChannels) -> None:
        settings = parts.settings
        self._parts = parts
        self._gate = parts.gate
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
        is_web = settings.grpc_worker_protocol == "grpc-web"
        self._unary = UnaryForward(
            dispatch,
            channels,
            parts.traffic,
            activation_timeout_s=settings.activation_timeout_s,
            pool=parts.pool if is_web else None,
            max_answer_bytes=settings.grpc_max_send_bytes,
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
            "ModelReady": _unary("ModelReady", self._keyed(self._model_ready)),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self._model_stream_infer),
        }
        for rpc in _FORWARDED:
            methods[rpc] = _unary(rpc, self._keyed(self._forwarder(rpc)))
        for rpc, message in _REFUSED.items():
            methods[rpc] = _unary(rpc, self._keyed(_refuser(message)))
        assert all(rpc in methods for rpc in _OPEN)
        return methods

    def _keyed(self, method: _Keyed) -> _Unary:
        """``method`` behind the gate: the call's key is authenticated and its rate and
        in-flight limits taken before it runs, and its place given back after."""

        async def call(data: bytes, context: _Context) -> bytes:
            admission = await self._gate.admit(_authorization(context))
            _note_key(admission.key_id)
            try:
                return await method(data, context, admission)
            finally:
                admission.release()

        return call

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

    async def _model_ready(self, data: bytes, context: _Context, admission: Pass) -> bytes:
        request = _parse(pb.ModelReadyRequest, data)
        self._gate.authorize(admission, request.name)
        is_ready = self._parts.catalog.cached(request.name)
        if is_ready is None:
            is_ready = await self._parts.catalog.is_registered(request.name)
        is_ready = is_ready and self._parts.catalog.failure(request.name) is None
        return pb.ModelReadyResponse(ready=is_ready).SerializeToString()

    def _forwarder(self, rpc: str) -> _Keyed:
        async def forward(data: bytes, context: _Context, admission: Pass) -> bytes:
            try:
                model = string_fields(data, (1,)).get(1, "")
            except MalformedMessageError:
                raise _Refusal(GrpcStatus(grpc.StatusCode.INTERNAL, UNPARSABLE_MESSAGE)) from None
            if rpc == "ModelStatistics" and not model:
                raise _Refusal(GrpcStatus(grpc.StatusCode.UNIMPLEMENTED, _ALL_MODELS_STATISTICS))
            self._gate.authorize(admission, model)
            would_activate = self._parts.buffer.would_activate
            if admission.key is not None and would_activate(model):
                # Registered first: an unknown name must not spend an activation.
                await self._dispatch.require(model)
                await self._gate.activation(admission, model, would_activate)
            return await self._unary(model, rpc, data, context)

        return forward

    async def _model_stream_infer(
        self, requests: AsyncIterator[bytes], context: _Context
    ) -> AsyncIterator[bytes]:
        try:
            admission = await self._gate.admit(_authorization(context))
        except Exception as exc:
            await _abort(context, grpc_status(exc, "ModelStreamInfer"))
        _note_key(admission.key_id)

        async def check(model: str) -> GrpcStatus | None:
            # Each request of the stream: its key may have been revoked since it opened.
            try:
                if not self._gate.still_valid(admission):
                    raise UnauthenticatedError(reason="the API key was revoked or expired")
                self._gate.authorize(admission, model)
                if admission.key is not None and self._parts.buffer.would_activate(model):
                    catalog = self._parts.catalog
                    is_known = catalog.cached(model)
                    if is_known is None:
                        is_known = await catalog.is_registered(model)
                    if is_known:
                        await self._gate.activation(
                            admission, model, self._parts.buffer.would_activate
                        )
            except ZeroserveError as exc:
                return grpc_status(exc, "ModelStreamInfer")
            return None

        try:
            async for data in self._stream.stream(requests, context, check=check):
                yield data
        except StreamStatusError as exc:
            await _abort(context, exc.status)
        except Exception as exc:
            await _abort(context, grpc_status(exc, "ModelStreamInfer"))
        finally:
            admission.release()


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


def _refuser(message: str) -> _Keyed:
    async def refuse(data: bytes, context: _Context, admission: Pass) -> bytes:
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
    metadata = status.metadata
    request_id = current_request_id()
    # The call's id, as on HTTP error answers, unless the worker's status already names it.
    if request_id is not None and all(key != request_ids.METADATA_KEY for key, _ in metadata):
        metadata = (*metadata, (request_ids.METADATA_KEY, request_id))
    await context.abort(status.code, status.message, metadata)


def _note_key(key_id: str | None) -> None:
    """The call's key id for the gate's later checks and for its access-log line."""
    CURRENT_KEY_ID.set(key_id)
    if key_id is not None:
        note_key_id(key_id)
