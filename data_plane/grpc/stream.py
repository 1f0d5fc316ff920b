"""ModelStreamInfer: many infer requests on one bidirectional stream.

Requests run concurrently, as on separate calls, and each response goes out when ready,
as Triton sends them; a client matches them to its requests by ``id``. A request to a
model that is not decoupled gets one response; one to a decoupled model gets each of
its model's responses (see the servicer's responder). A request that fails gets a
response carrying ``error_message`` (and its ``id``) and the stream goes on; responses
carry the ``triton_final_response`` parameter, as Triton's do. At most ``max_in_flight``
requests of a stream are running and at most as many responses wait to be sent: past
that the stream is not read, and a decoupled model waits to send, until a response is
sent, so a client that does not read its answers meets gRPC's flow control instead of
growing the server's memory.

A message that is not a ModelInferRequest ends the stream, once the requests before it
are answered, with Triton's unary answer (INTERNAL, "Unable to parse request"); Triton
itself closes such a stream with no status, which a client cannot tell from a clean end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from data_plane.grpc.codec import parse
from data_plane.grpc.status import error_status
from foundation.proto import grpc_service_pb2 as pb

FINAL_RESPONSE = "triton_final_response"
"""The response parameter telling a streaming client that a request is fully answered."""


class Respond(Protocol):
    """One infer request to its responses (the last one final); errors come as
    responses carrying them."""

    def __call__(
        self, request: pb.ModelInferRequest
    ) -> AsyncIterator[pb.ModelStreamInferResponse]: ...


@dataclass(frozen=True, slots=True)
class _End:
    """The reader is done: the client half-closed (``error`` None) or sent something the
    stream must end on."""

    error: Exception | None


class StreamInfer:
    """Serves ModelStreamInfer streams with ``respond``."""

    def __init__(self, respond: Respond, *, max_in_flight: int) -> None:
        self._respond = respond
        self._max_in_flight = max_in_flight

    async def stream(
        self, requests: AsyncIterator[bytes]
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """The responses to ``requests`` (serialized ModelInferRequests), as they are
        ready; raises the error the stream must end with, if any. Closing the stream
        cancels the requests still running."""
        ready: asyncio.Queue[pb.ModelStreamInferResponse | _End] = asyncio.Queue(
            self._max_in_flight + 1
        )
        slots = asyncio.Semaphore(self._max_in_flight)
        running: set[asyncio.Task[None]] = set()

        async def answer(request: pb.ModelInferRequest) -> None:
            try:
                async for response in self._respond(request):
                    await ready.put(response)
            finally:
                slots.release()

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
            await ready.put(end)

        reader = asyncio.create_task(read(), name="grpc-stream-reader")
        try:
            while True:
                item = await ready.get()
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return
                yield item
        finally:
            reader.cancel()
            for task in running:
                task.cancel()
            await asyncio.gather(reader, *running, return_exceptions=True)


def error_response(request: pb.ModelInferRequest, error: Exception) -> pb.ModelStreamInferResponse:
    """A request refused before its model ran: its id and the error."""
    _, message = error_status(error, "ModelStreamInfer")
    return pb.ModelStreamInferResponse(
        error_message=message, infer_response=pb.ModelInferResponse(id=request.id)
    )


def final_response(
    response: pb.ModelInferResponse, *, is_final: bool
) -> pb.ModelStreamInferResponse:
    """``response`` with Triton's ``triton_final_response`` parameter."""
    response.parameters[FINAL_RESPONSE].bool_param = is_final
    return pb.ModelStreamInferResponse(infer_response=response)


def model_error_response(
    request: pb.ModelInferRequest, model: str, error: Exception
) -> pb.ModelStreamInferResponse:
    """A model's error ending its request, as Triton sends it: the id, the model's name
    and the final flag beside the error."""
    _, message = error_status(error, "ModelStreamInfer")
    response = pb.ModelInferResponse(id=request.id, model_name=model)
    response.parameters[FINAL_RESPONSE].bool_param = True
    return pb.ModelStreamInferResponse(error_message=message, infer_response=response)
