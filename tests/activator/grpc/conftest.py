"""The activator's gRPC listener in process, over fake workers (fake_worker.py) and the
activator's fake store: a client channel to it, and helpers to place models and call."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from activator.core import ActivatorCore
from activator.grpc.server import GrpcListener
from activator.settings import ActivatorSettings
from foundation.proto import grpc_service_pb2 as pb
from foundation.records import Placement
from tests.activator.fakes import FakeStore
from tests.activator.grpc.fake_worker import SERVICE, WORKER_PARAMETER, FakeWorker

WAIT_S = 30.0
"""Bound on any one wait; reached only when something is broken."""

_M = TypeVar("_M", bound=Message)


def settings(**overrides: Any) -> ActivatorSettings:
    # No stall probes: the fake workers serve no HTTP, and some tests hold calls on purpose.
    base = ActivatorSettings(startup_sync_timeout_s=5.0, upstream_stall_s=3600.0, auth="off")
    return base.model_copy(update=overrides)


async def place(
    store: FakeStore, model: str, worker: FakeWorker | str, worker_id: str = ""
) -> None:
    """Publish a placement of ``model`` on ``worker`` (or on a bare gRPC address)."""
    url = "http://127.0.0.1:9"
    if isinstance(worker, FakeWorker):
        address, worker_id, url = worker.address, worker.worker_id, worker.url
    else:
        address = worker
    await store.add_placement(
        Placement(model=model, worker_id=worker_id, url=url, grpc_address=address)
    )


class PlaceOnActivate:
    """An ``Activate`` that places the model on ``workers`` (after ``gate``, when given)."""

    def __init__(
        self,
        store: FakeStore,
        workers: Sequence[FakeWorker],
        *,
        gate: asyncio.Event | None = None,
        error: Exception | None = None,
    ) -> None:
        self.store = store
        self.workers = workers
        self.gate = gate
        self.error = error
        self.calls: list[str] = []
        self.called = asyncio.Event()

    async def __call__(self, model: str) -> None:
        self.calls.append(model)
        self.called.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        for worker in self.workers:
            await place(self.store, model, worker)


@dataclass
class Client:
    """A channel to the activator's gRPC listener, with typed calls."""

    channel: grpc.aio.Channel
    core: ActivatorCore
    listener: GrpcListener

    def unary(self, rpc: str, response: type[_M]) -> grpc.aio.UnaryUnaryMultiCallable[Any, _M]:
        return self.channel.unary_unary(
            f"/{SERVICE}/{rpc}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,
        )

    def raw(self, rpc: str) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
        return self.channel.unary_unary(f"/{SERVICE}/{rpc}")

    def stream(self, **kw: Any) -> grpc.aio.StreamStreamCall[Any, pb.ModelStreamInferResponse]:
        open_stream: grpc.aio.StreamStreamMultiCallable[Any, pb.ModelStreamInferResponse]
        open_stream = self.channel.stream_stream(
            f"/{SERVICE}/ModelStreamInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        return open_stream(**kw)

    def raw_stream(self) -> grpc.aio.StreamStreamCall[bytes, bytes]:
        open_stream: grpc.aio.StreamStreamMultiCallable[bytes, bytes]
        open_stream = self.channel.stream_stream(f"/{SERVICE}/ModelStreamInfer")
        return open_stream()

    async def infer(
        self, model: str, *, request_id: str = "", payload: bytes = b"\x01\x02\x03\x04", **kw: Any
    ) -> pb.ModelInferResponse:
        return await self.unary("ModelInfer", pb.ModelInferResponse)(
            infer_request(model, request_id=request_id, payload=payload), **kw
        )


def infer_request(
    model: str, *, request_id: str = "", payload: bytes = b"\x01\x02\x03\x04"
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="INPUT0", datatype="UINT8", shape=[len(payload)])
    request.raw_input_contents.append(payload)
    return request


def answered_by(response: pb.ModelInferResponse) -> str:
    return response.parameters[WORKER_PARAMETER].string_param


@contextlib.asynccontextmanager
async def grpc_activator(
    store: FakeStore, activate: Any, **overrides: Any
) -> AsyncIterator[Client]:
    """The activator's gRPC listener on a free port, and a channel to it."""
    config = settings(**overrides)
    core = ActivatorCore(config, store, activate, "act-1")
    listener = GrpcListener(core, config, port=0)
    try:
        async with listener, grpc.aio.insecure_channel(listener.address) as channel:
            yield Client(channel, core, listener)
    finally:
        await listener.aclose()


async def wait_until(predicate: Any, timeout_s: float = WAIT_S) -> None:
    """Poll ``predicate`` every few milliseconds until it holds."""
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110 - the conditions are plain state
            await asyncio.sleep(0.005)
