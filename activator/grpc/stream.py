"""ModelStreamInfer through the activator: a client's stream passed on to the workers message
by message, never buffered whole.

Triton lets one stream carry requests for several models, so a client stream gets one
*lane* per model it names: the lane's first request is routed like a unary call (the
least busy replica, or a turn in the model's buffer while it is at zero, which asks for
its activation once per burst) and opens a stream to that replica's worker; the model's
later requests on the client stream follow on that worker stream, and every worker
stream's responses are sent back as they come, interleaved. A lane keeps its worker
stream, and so its replica, until the client half-closes (or the worker stream fails):
least-outstanding choice happens per lane, not per request.

Requests of a sequence (their ``sequence_id`` parameter) must reach the replica that holds
the sequence's state, and Triton's clients send every step of a sequence on one stream,
interleaved with other sequences: such a request is routed when it is read (the
sequence's bound replica, else the one its ID hashes to, as for unary calls:
:mod:`activator.grpc.dispatch`), bound there, and goes on the lane of that model *and
replica*, so the sequences of one stream spread over their replicas and each keeps its
order. While the model has no replica the reader waits for its activation (bounded by
``activation_timeout_s``) before reading on. A request of a sequence whose worker is gone
gets an error response saying its state is lost (as HTTP's 410), and the stream goes on.

A request that cannot be routed (unknown model, full buffer, activation failed or timed
out) gets a response carrying ``error_message`` and its ``id``, as Triton answers a failed
request in a stream, and the stream goes on. So do the requests a worker had not answered
when its stream broke (a killed worker): the lane then routes its next request afresh. A
worker that ends its stream with a status of its own (not UNAVAILABLE) ends the client's
stream with that status, as the worker meant it to. A message that is not a
ModelInferRequest ends the stream with Triton's INTERNAL "Unable to parse request", once
the requests before it are answered.

Bounds: at most ``max_in_flight`` requests of a client stream are unanswered or answered
but not yet sent; past that the client stream is not read, so gRPC's flow control slows
the client down. A request waits at most ``upstream_read_timeout_s`` for its response
while its worker sends nothing; then the lane's pending requests fail with the timeout.
Each request counts as its model's traffic, and in its replica's in-flight count, from
when the lane takes it until its response.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import grpc

from activator.access_log import note_model
from activator.grpc.channels import WorkerChannels
from activator.grpc.dispatch import Dispatch, method_path, worker_failure
from activator.grpc.status import UNPARSABLE_MESSAGE, GrpcStatus, grpc_status
from activator.grpc.unary import forwarded_metadata
from activator.grpc.wire import MalformedMessageError, sequence_tag, string_fields
from activator.grpc.worker_stream import StreamRequest, WorkerStream, error_response
from activator.sequences import SequenceTag
from activator.traffic import Traffic

__all__ = ["StreamForward", "StreamStatusError"]

logger = logging.getLogger(__name__)

_PATH: Final = method_path("ModelStreamInfer")
_MODEL_NAME = 1
_REQUEST_ID = 3


Check = Callable[[str], Awaitable[GrpcStatus | None]]
"""Asked about the model of each request a stream reads: None lets it through, a status
ends the stream."""


class StreamStatusError(Exception):
    """The client stream must end with ``status``."""

    def __init__(self, status: GrpcStatus) -> None:
        super().__init__(status.message)
        self.status = status


@dataclass(frozen=True, slots=True)
class _Answer:
    data: bytes
    holds_slot: bool
    """Whether sending it frees one of the stream's in-flight slots (every answer to a
    request does; an extra response a worker sends would not)."""


@dataclass(frozen=True, slots=True)
class _End:
    status: GrpcStatus | None


_CLOSE: Final = None
"""Put in a lane's queue when the client half-closed: no request follows."""


class StreamForward:
    """Serves ModelStreamInfer streams over the workers' channels.

    Parameters:
        dispatch: the replica choice.
        channels: one channel per worker.
        traffic: counts each request from the lane taking it to its response.
        activation_timeout_s: how long a lane's first request may wait in the buffer.
        max_in_flight: the per-stream bound (see the module's docstring).
    """

    def __init__(
        self,
        dispatch: Dispatch,
        channels: WorkerChannels,
        traffic: Traffic,
        *,
        activation_timeout_s: float,
        max_in_flight: int,
    ) -> None:
        self.dispatch = dispatch
        self.channels = channels
        self.traffic = traffic
        self.activation_timeout_s = activation_timeout_s
        self.max_in_flight = max_in_flight

    async def stream(
        self,
        requests: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext[bytes, bytes],
        *,
        check: Check | None = None,
    ) -> AsyncIterator[bytes]:
        """The responses to ``requests`` (serialized ModelInferRequests) as they come.

        ``check`` is asked about each request's model as it is read; a status from it ends
        the stream with that status, once the requests before are answered.

        Raises:
            StreamStatusError: the status the stream must end with.
        """
        session = _Session(self, context, check)
        async for data in session.run(requests):
            yield data


class _Session:
    """One client stream: its reader, lanes and outgoing queue."""

    def __init__(
        self,
        forward: StreamForward,
        context: grpc.aio.ServicerContext[bytes, bytes],
        check: Check | None = None,
    ):
        self.forward = forward
        self.context = context
        self.check = check
        self.metadata = forwarded_metadata(context.invocation_metadata())
        # Bounded by the slots: an answer holds its request's slot until it is sent.
        self.out: asyncio.Queue[_Answer | _End] = asyncio.Queue()
        self.slots = asyncio.Semaphore(forward.max_in_flight)
        # Keyed by model, or by (model, worker id) for the lanes of sequences.
        self.lanes: dict[str | tuple[str, str], _Lane] = {}

    async def run(self, requests: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        reader = asyncio.create_task(self._read(requests), name="grpc-stream-reader")
        try:
            while True:
                item = await self.out.get()
                if isinstance(item, _End):
                    if item.status is not None:
                        raise StreamStatusError(item.status)
                    return
                if item.holds_slot:
                    self.slots.release()
                yield item.data
        finally:
            reader.cancel()
            tasks = [lane.task for lane in self.lanes.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(reader, *tasks, return_exceptions=True)

    def answer(self, data: bytes, *, holds_slot: bool = True) -> None:
        self.out.put_nowait(_Answer(data, holds_slot))

    def end(self, status: GrpcStatus) -> None:
        """End the client stream with ``status`` now (answers already queued go first)."""
        self.out.put_nowait(_End(status))

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        status: GrpcStatus | None = None
        async for data in requests:
            try:
                fields = string_fields(data, (_MODEL_NAME, _REQUEST_ID))
            except MalformedMessageError:
                status = GrpcStatus(grpc.StatusCode.INTERNAL, UNPARSABLE_MESSAGE)
                break
            model = fields.get(_MODEL_NAME, "")
            if self.check is not None:
                status = await self.check(model)
                if status is not None:
                    break
            await self.slots.acquire()
            request = StreamRequest(data, fields.get(_REQUEST_ID, ""))
            key: str | tuple[str, str] = model
            worker_id: str | None = None
            sequence = None
            if self.forward.dispatch.sequences is not None:
                sequence = sequence_tag(data)
            if sequence is not None:
                try:
                    worker_id = await self._sequence_worker(model, sequence)
                except Exception as exc:
                    self.answer(
                        error_response(grpc_status(exc, "ModelStreamInfer").message, request.id)
                    )
                    continue
                key = (model, worker_id)
            lane = self.lanes.get(key)
            if lane is None:
                lane = self.lanes[key] = _Lane(self, model, key, worker_id)
            lane.queue.put_nowait(request)
        # The end goes after every answer: let the lanes finish what they hold.
        lanes = list(self.lanes.values())
        for lane in lanes:
            lane.queue.put_nowait(_CLOSE)
        await asyncio.gather(*(lane.task for lane in lanes), return_exceptions=True)
        self.out.put_nowait(_End(status))

    async def _sequence_worker(self, model: str, sequence: SequenceTag) -> str:
        """The worker a request of ``sequence`` goes to, now bound there (or unbound at END)."""
        forward = self.forward
        dispatch = forward.dispatch
        await dispatch.require(model)
        replica = dispatch.sequence_replica(model, sequence)
        if replica is None:
            deadline = asyncio.get_running_loop().time() + forward.activation_timeout_s
            turn = await dispatch.take_turn(model, deadline=deadline, sequence=sequence)
            # The lane takes its own turn on this replica: the buffer's grant is done with.
            turn.release()
            replica = turn.replica
        dispatch.sequence_sent(model, sequence, replica.worker_id)
        return replica.worker_id

    def lane_done(self, lane: _Lane) -> None:
        if self.lanes.get(lane.key) is lane:
            del self.lanes[lane.key]


class _Lane:
    """One model's requests on one client stream (or those of its sequences routed to one
    worker, ``worker_id``), and its worker stream once routed."""

    def __init__(
        self,
        session: _Session,
        model: str,
        key: str | tuple[str, str],
        worker_id: str | None = None,
    ) -> None:
        self.session = session
        self.model = model
        self.key = key
        self.worker_id = worker_id
        # Bounded by the session's slots, taken before each put.
        self.queue: asyncio.Queue[StreamRequest | None] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(), name=f"grpc-stream-lane-{model}")

    async def _run(self) -> None:
        forward = self.session.forward
        try:
            while True:
                request = await self.queue.get()
                if request is _CLOSE:
                    return
                try:
                    await forward.dispatch.require(self.model)
                except Exception as exc:
                    self._fail_one(request, exc)
                    if self.queue.empty():
                        # An unknown name holds nothing: a stream naming many costs no lanes.
                        return
                    continue
                note_model(self.model)
                if not await self._serve(request):
                    return
        finally:
            self.session.lane_done(self)

    async def _serve(self, first: StreamRequest) -> bool:
        """Route ``first``, open a worker stream and carry the lane's requests on it until
        the client half-closes (False) or the worker stream ends (True: route again)."""
        forward = self.session.forward
        forward.traffic.begin(self.model)
        try:
            worker = await self._open(first)
        except Exception as exc:
            forward.traffic.end(self.model)
            self._fail_one(first, exc)
            return True
        try:
            return await worker.carry(first, self.queue)
        finally:
            worker.close()

    async def _open(self, first: StreamRequest) -> WorkerStream:
        forward = self.session.forward
        dispatch = forward.dispatch
        loop = asyncio.get_running_loop()
        deadline = loop.time() + forward.activation_timeout_s
        requeue = False
        while True:
            if self.worker_id is not None:
                sequence = sequence_tag(first.data)
                assert sequence is not None
                turn = dispatch.pinned_turn(self.model, self.worker_id, sequence)
            else:
                turn = await dispatch.take_turn(self.model, deadline=deadline, requeue=requeue)
            address = turn.replica.grpc_address
            channel = forward.channels.acquire(address)
            open_stream: grpc.aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
                _PATH
            )
            call = open_stream(
                metadata=self.session.metadata, timeout=self.session.context.time_remaining()
            )
            try:
                await call.wait_for_connection()
            except grpc.aio.AioRpcError as exc:
                forward.channels.release(address)
                if dispatch.not_sent(self.model, turn, exc):
                    # A sequence's lane goes nowhere else: next round says its state is lost.
                    requeue = True
                    continue
                turn.release()
                raise worker_failure(
                    self.model, turn.replica, exc, timeout_s=dispatch.read_timeout_s
                ) from None
            except BaseException:
                call.cancel()
                forward.channels.release(address)
                turn.release()
                raise
            return WorkerStream(
                self.model,
                call,
                turn,
                channels=forward.channels,
                traffic=forward.traffic,
                read_timeout_s=dispatch.read_timeout_s,
                outlet=self.session,
            )

    def _fail_one(self, request: StreamRequest, error: BaseException) -> None:
        message = grpc_status(error, "ModelStreamInfer").message
        self.session.answer(error_response(message, request.id))
