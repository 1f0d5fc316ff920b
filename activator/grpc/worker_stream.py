"""A client stream's stream to one worker, for one model (see :mod:`activator.grpc.stream`).

The worker's responses are passed on as they come; each request is accounted from its
write to its response, and when the worker stream breaks or goes silent past the read
timeout, the requests it had not answered are answered with ``error_message`` and their
``id``, as Triton answers a failed request in a stream.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from dataclasses import dataclass
from typing import Protocol

import grpc

from activator.errors import UpstreamError, UpstreamTimeoutError
from activator.grpc.channels import WorkerChannels
from activator.grpc.dispatch import Turn, WorkerStatusError, worker_failure
from activator.grpc.status import GrpcStatus, grpc_status
from activator.grpc.wire import MalformedMessageError, submessage_string
from activator.traffic import Traffic
from foundation.proto import grpc_service_pb2 as pb

__all__ = ["Outlet", "StreamRequest", "WorkerStream", "error_response"]

_REQUEST_ID = 3
_INFER_RESPONSE = 2
"""ModelStreamInferResponse.infer_response; its ModelInferResponse carries ``id`` as 3."""


@dataclass(frozen=True, slots=True)
class StreamRequest:
    """One request of a client stream: its bytes and its ``id``."""

    data: bytes
    id: str


class Outlet(Protocol):
    """Where a worker stream's answers go (the client stream)."""

    def answer(self, data: bytes, *, holds_slot: bool = True) -> None:
        """Send ``data`` to the client; ``holds_slot`` when it answers one request."""

    def end(self, status: GrpcStatus) -> None:
        """End the client stream with ``status`` once what was answered is sent."""


def error_response(message: str, request_id: str) -> bytes:
    """A stream's answer to a request that failed."""
    response = pb.ModelStreamInferResponse(
        error_message=message, infer_response=pb.ModelInferResponse(id=request_id)
    )
    return response.SerializeToString()


class WorkerStream:
    """One model's stream to one worker, within a client's stream: requests written as the
    caller hands them over, responses sent on to ``outlet`` as they come, each request
    counted (traffic, the replica's in flight and awaiting a head) from its write to its
    response.

    Parameters:
        model: the model every request on it names.
        call: the worker stream, connected.
        turn: the replica it goes to, and its buffer grant if it waited for one.
        channels: given the channel back on :meth:`close`.
        traffic: counts each request; told of the cold start's first response.
        read_timeout_s: how long pending requests may wait with nothing from the worker.
        outlet: where responses and failures go.
    """

    def __init__(
        self,
        model: str,
        call: grpc.aio.StreamStreamCall[bytes, bytes],
        turn: Turn,
        *,
        channels: WorkerChannels,
        traffic: Traffic,
        read_timeout_s: float,
        outlet: Outlet,
    ) -> None:
        self.model = model
        self.call = call
        self.turn = turn
        self._channels = channels
        self._traffic = traffic
        self._read_timeout_s = read_timeout_s
        self._outlet = outlet
        self.pending: collections.Counter[str] = collections.Counter()
        """Request ids sent and not answered, with how many of each (ids may repeat, and
        are often all empty)."""
        self.pending_count = 0
        self.has_responded = False
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.Timeout | None = None

    async def carry(self, first: StreamRequest, queue: asyncio.Queue[StreamRequest | None]) -> bool:
        """Carry ``first`` (already counted as traffic) and the requests that follow on
        ``queue`` (None: the client half-closed); False once done (the client half-closed,
        or the client stream must end), True when the worker stream ended first and the
        model's next requests must be routed afresh."""
        self._sent(first)
        writer = asyncio.create_task(self._write(first, queue), name="grpc-stream-writer")
        try:
            failure = await self._read_all()
        finally:
            is_half_closed = (
                writer.done() and not writer.cancelled() and writer.exception() is None
            ) and writer.result()
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
        if failure is None and self.pending_count == 0:
            return not is_half_closed
        replica = self.turn.replica
        if failure is None:
            failure = UpstreamError(
                model=self.model,
                url=replica.grpc_address,
                reason="the worker ended its stream with requests unanswered",
            )
        self._fail_pending(failure)
        if isinstance(failure, WorkerStatusError):
            self._outlet.end(GrpcStatus(failure.code, failure.details, failure.metadata))
            return False
        return not is_half_closed

    def close(self) -> None:
        """Cancel the call if it still runs and give back what it holds (requests still
        pending stop counting: their client left)."""
        self.call.cancel()
        self._channels.release(self.turn.replica.grpc_address)
        self.turn.release()
        while self.pending_count:
            self._settle(next(iter(self.pending)))

    async def _write(
        self, first: StreamRequest, queue: asyncio.Queue[StreamRequest | None]
    ) -> bool:
        """Write requests until the queue says the client half-closed (None; True) or the
        call ends (False)."""
        request: StreamRequest | None = first
        while request is not None:
            try:
                await self.call.write(request.data)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                return False  # the reader sees why the call ended
            request = await queue.get()
            if request is not None:
                self._traffic.begin(self.model)
                self._sent(request)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self.call.done_writing()
        return True

    async def _read_all(self) -> Exception | None:
        """Read the worker's responses to the end; None at a clean end, else what failed."""
        read_timeout_s = self._read_timeout_s
        try:
            async with asyncio.timeout(None) as timer:
                self._timer = timer
                self._arm()
                while True:
                    data = await self.call.read()
                    if data is grpc.aio.EOF:
                        return None
                    assert isinstance(data, bytes)
                    self._received(data)
        except TimeoutError:
            return UpstreamTimeoutError(
                model=self.model, url=self.turn.replica.grpc_address, timeout_s=read_timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            return worker_failure(self.model, self.turn.replica, exc, timeout_s=read_timeout_s)
        finally:
            self._timer = None

    def _arm(self) -> None:
        """Give the worker ``upstream_read_timeout_s`` from now for its next response while
        requests are pending, and all the time in the world while none is."""
        if self._timer is not None:
            when = None
            if self.pending_count:
                when = self._loop.time() + self._read_timeout_s
            self._timer.reschedule(when)

    def _sent(self, request: StreamRequest) -> None:
        replica = self.turn.replica
        self.pending[request.id] += 1
        self.pending_count += 1
        replica.in_flight += 1
        if not replica.awaiting_head:
            replica.progress_at = self._loop.time()
        replica.awaiting_head += 1
        if self.pending_count == 1:
            self._arm()

    def _received(self, data: bytes) -> None:
        try:
            request_id = submessage_string(data, _INFER_RESPONSE, _REQUEST_ID)
        except MalformedMessageError:
            request_id = ""
        is_answer = False
        if self.pending_count:
            # A response whose id matches nothing pending still answers one request: each
            # request has exactly one response.
            is_answer = True
            self._settle(request_id if self.pending[request_id] else next(iter(self.pending)))
        self.turn.replica.progress_at = self._loop.time()
        if not self.has_responded:
            self.has_responded = True
            waited_s = self.turn.responded()
            if waited_s is not None:
                self._traffic.first_response(self.model, self.turn.replica.worker_id, waited_s)
        self._arm()
        self._outlet.answer(data, holds_slot=is_answer)

    def _settle(self, request_id: str) -> None:
        """One pending request with ``request_id`` is answered (or given up)."""
        self.pending[request_id] -= 1
        if self.pending[request_id] <= 0:
            del self.pending[request_id]
        self.pending_count -= 1
        replica = self.turn.replica
        replica.in_flight -= 1
        replica.awaiting_head -= 1
        self._traffic.end(self.model)

    def _fail_pending(self, error: Exception) -> None:
        message = (
            error.details
            if isinstance(error, WorkerStatusError)
            else grpc_status(error, "ModelStreamInfer").message
        )
        for request_id, count in list(self.pending.items()):
            for _ in range(count):
                self._settle(request_id)
                self._outlet.answer(error_response(message, request_id))
