"""A worker's gRPC surface in process, for the router's tests: answers ModelInfer and
ModelStreamInfer by echoing, ModelMetadata/ModelConfig/ModelStatistics with a small
message, and records what it got; a test can hold its answers, make it fail, or stop it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from foundation.proto import grpc_service_pb2 as pb

SERVICE = "inference.GRPCInferenceService"
WORKER_PARAMETER = "worker"
"""The response parameter naming the worker that answered."""


class FakeWorker:
    """One fake worker on a free loopback port; ``async with`` starts and stops it."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.requests: list[pb.ModelInferRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.timeouts: list[float | None] = []
        self.hold: asyncio.Event | None = None
        """While set to an unset event, ModelInfer and each stream request wait for it."""
        self.error: tuple[grpc.StatusCode, str] | None = None
        """When set, ModelInfer and ModelMetadata end with this status."""
        self.active = 0
        self.cancelled = 0
        self.streams_opened = 0
        self.started = asyncio.Event()
        """Set once a call reached the worker (and waits, with ``hold``)."""
        self._server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeWorker:
        server = self._server = grpc.aio.server()
        server.add_generic_rpc_handlers([self._handler()])
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def stop(self, grace_s: float | None = None) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)

    def _handler(self) -> grpc.GenericRpcHandler:
        def unary(method: Any) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.unary_unary_rpc_method_handler(method)

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "ModelInfer": unary(self._infer),
                "ModelMetadata": unary(self._metadata),
                "ModelConfig": unary(self._config),
                "ModelStatistics": unary(self._statistics),
                "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self._stream),
            },
        )

    def _answer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        response = pb.ModelInferResponse(
            model_name=request.model_name, model_version="1", id=request.id
        )
        response.parameters[WORKER_PARAMETER].string_param = self.worker_id
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=False):
            out = response.outputs.add(name=tensor.name, datatype=tensor.datatype)
            out.shape.extend(tensor.shape)
            response.raw_output_contents.append(raw)
        return response

    async def _wait(self) -> None:
        self.started.set()
        if self.hold is not None:
            await self.hold.wait()

    async def _infer(self, data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        request = pb.ModelInferRequest.FromString(data)
        self.requests.append(request)
        metadata = context.invocation_metadata() or ()
        self.metadata.append({key: str(value) for key, value in metadata})
        self.timeouts.append(context.time_remaining())
        self.active += 1
        try:
            await self._wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
        if self.error is not None:
            await context.abort(*self.error)
        return self._answer(request).SerializeToString()

    async def _metadata(self, data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        request = pb.ModelMetadataRequest.FromString(data)
        if self.error is not None:
            await context.abort(*self.error)
        response = pb.ModelMetadataResponse(
            name=request.name, versions=["1"], platform=f"fake:{self.worker_id}"
        )
        return response.SerializeToString()

    async def _config(self, data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        request = pb.ModelConfigRequest.FromString(data)
        response = pb.ModelConfigResponse()
        response.config.name = request.name
        response.config.max_batch_size = 8
        return response.SerializeToString()

    async def _statistics(self, data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        request = pb.ModelStatisticsRequest.FromString(data)
        response = pb.ModelStatisticsResponse()
        response.model_stats.add(name=request.name, version="1", inference_count=7)
        return response.SerializeToString()

    async def _stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        self.streams_opened += 1
        self.active += 1
        try:
            async for data in requests:
                request = pb.ModelInferRequest.FromString(data)
                self.requests.append(request)
                await self._wait()
                if request.id.startswith("fail"):
                    response = pb.ModelStreamInferResponse(
                        error_message=f"failed {request.id}",
                        infer_response=pb.ModelInferResponse(id=request.id),
                    )
                else:
                    response = pb.ModelStreamInferResponse(infer_response=self._answer(request))
                yield response.SerializeToString()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
