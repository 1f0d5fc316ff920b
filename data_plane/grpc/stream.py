"""ModelStreamInfer: many infer requests on one bidirectional stream, one response each.

Requests run concurrently, as on separate calls, and each response goes out when ready,
as Triton sends them; a client matches them to its requests by ``id``. A request that
fails gets a response carrying ``error_message`` (and its ``id``) and the stream goes on;
successful responses carry the ``triton_final_response`` parameter, as Triton's do. At
most ``max_in_flight`` requests of a stream are running or answered but unsent: past that
the stream is not read until a response is sent, so a client that does not read its
answers meets gRPC's flow control instead of growing the server's memory.

A message that is not a ModelInferRequest ends the stream, once the requests before it
are answered, with Triton's unary answer (INTERNAL, "Unable to parse request"); Triton
itself closes such a stream with no status, which a client cannot tell from a clean end.
The data plane's models are not decoupled: each request has exactly one response.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Protocol

from data_plane.grpc.codec import parse
from data_plane.grpc.status import error_status
from foundation.proto import grpc_service_pb2 as pb

FINAL_RESPONSE = "triton_final_response"
"""The response parameter telling a streaming client that a request is fully answered."""


class Infer(Protocol):
    """One infer request to its response, raising the data plane's errors."""

    def __call__(self, request: pb.ModelInferRequest) -> Awaitable[pb.ModelInferResponse]: ...


@dataclass(frozen=True, slots=True)
class _End:
    """The reader is done: the client half-closed (``error`` None) or sent something the
    stream must end on."""

    error: Exception | None


class StreamInfer:
    """Serves ModelStreamInfer streams with ``infer``."""

    def __init__(self, infer: Infer, *, max_in_flight: int) -> None:
        self._infer = infer
        self._max_in_flight = max_in_flight

    async def stream(
        self, requests: AsyncIterator[bytes]
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """The responses to ``requests`` (serialized ModelInferRequests), as they are
        ready; raises the error the stream must end with, if any. Closing the stream
        cancels the requests still running."""
        # Bounded by the slots: a response holds its slot until it is taken from here.
        ready: asyncio.Queue[pb.ModelStreamInferResponse | _End] = asyncio.Queue()
        slots = asyncio.Semaphore(self._max_in_flight)
        running: set[asyncio.Task[None]] = set()

        async def answer(request: pb.ModelInferRequest) -> None:
            ready.put_nowait(await self._respond(request))

        async def read() -> None:
            end = _End(None)
            try:
                async for data in requests:
                    request = parse(pb.ModelInferRequest, data)
                    await slots.acquire()
                    task = asyncio.create_task(answer(request), name="grpc-stream-request")
                    running.add(task)
                    task.add_done_callback(running.discard)
            except Exception as exc:
                end = _End(exc)
            # The end goes after every answer: wait for the requests still running.
            while running:
                await asyncio.wait(set(running))
            ready.put_nowait(end)

        reader = asyncio.create_task(read(), name="grpc-stream-reader")
        try:
            while True:
                item = await ready.get()
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return
                slots.release()
                yield item
        finally:
            reader.cancel()
            for task in running:
                task.cancel()
            await asyncio.gather(reader, *running, return_exceptions=True)

    async def _respond(self, request: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
        try:
            response = await self._infer(request)
        except Exception as exc:
            _, message = error_status(exc, "ModelStreamInfer")
            return pb.ModelStreamInferResponse(
                error_message=message, infer_response=pb.ModelInferResponse(id=request.id)
            )
        response.parameters[FINAL_RESPONSE].bool_param = True
        return pb.ModelStreamInferResponse(infer_response=response)
