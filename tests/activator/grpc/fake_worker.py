"""A worker's gRPC surface in process, for the router's tests: answers ModelInfer and
ModelStreamInfer by echoing, ModelMetadata/ModelConfig/ModelStatistics with a small
message, and records what it got; a test can hold its answers, make it fail, or stop it.
It serves the same methods on a gRPC port (grpc.aio) and as gRPC-Web on an HTTP port
(uvicorn), as a real worker does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import uvicorn

from activator.grpc.front import front_rpcs
from foundation.grpc_front.app import GrpcApp
from foundation.grpc_front.web import GrpcWebApp
from foundation.proto import grpc_service_pb2 as pb
from tests.uvicorn_server import serving

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
        self._http: contextlib.AsyncExitStack | None = None
        self._uvicorn: uvicorn.Server | None = None
        self.port = 0
        self.url = ""
        """The HTTP port's base URL (gRPC-Web)."""
        self.web: GrpcWebApp | None = None
        """The HTTP port's ASGI app."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeWorker:
        server = self._server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler(SERVICE, self._methods())]
        )
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        web = self.web = GrpcWebApp(
            GrpcApp(
                front_rpcs(self._methods()),
                max_receive_bytes=1 << 22,
                max_send_bytes=1 << 22,
                max_concurrent_rpcs=100,
            )
        )
        config = uvicorn.Config(web, host="127.0.0.1", port=0, lifespan="off", log_level="error")
        self._uvicorn = uvicorn.Server(config)
        self._http = contextlib.AsyncExitStack()
        self.url = await self._http.enter_async_context(serving(self._uvicorn))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop both ports; calls in flight get ``grace_s`` on the gRPC port."""
        if self._server is not None:
            await self._server.stop(grace_s)
        if self._http is not None:
            http, self._http = self._http, None
            if grace_s is None:
                # A worker that dies: its connections drop, calls in flight with them.
                assert self._uvicorn is not None
                for connection in list(self._uvicorn.server_state.connections):
                    connection.transport.abort()
            await http.aclose()

    def _methods(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        def unary(method: Any) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.unary_unary_rpc_method_handler(method)

        return {
            "ModelInfer": unary(self._infer),
            "ModelMetadata": unary(self._metadata),
            "ModelConfig": unary(self._config),
            "ModelStatistics": unary(self._statistics),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self._stream),
        }

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
