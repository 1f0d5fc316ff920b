"""Choosing the replica a gRPC call goes to, and reading how a call to a worker failed.

The same semantics as the HTTP proxy's (:mod:`activator.proxy`), on the same table and
buffer: the replica with the fewest requests in flight, or, while the model has none (or
already has requests waiting), a turn in the model's buffer, whose first waiter asks for
the model's activation. A worker that refused the connection never saw the call, so the
call goes to another replica or back to the front of the buffer; any other failure is the
caller's to report, since the worker may have run the request.

A request of a sequence (its ``sequence_id`` parameter, :func:`activator.grpc.wire.sequence_tag`)
goes where HTTP sends it (:mod:`activator.sequences`): to the replica the sequence is bound
to, else to the one its ID hashes to; bound to a worker that no longer serves the model,
it gets :class:`SequenceLostError` unless it starts the sequence again. Both protocols
share one :class:`SequenceBindings`, so a sequence may mix them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Final

import grpc

from activator.access_log import note_activation_wait
from activator.buffer import Buffer, Grant
from activator.errors import (
    ModelNotRegisteredError,
    NoGrpcEndpointError,
    SequenceLostError,
    UpstreamError,
    UpstreamTimeoutError,
)
from activator.grpc.status import Metadata
from activator.lb import Replica, choose_for_key
from activator.placements import ModelCatalog, PlacementView, ReplicaTable
from activator.sequences import SequenceBindings, SequenceTag
from foundation.errors import ModelFailedError

__all__ = [
    "SERVICE",
    "Dispatch",
    "Turn",
    "WorkerStatusError",
    "is_not_connected",
    "status_failure",
    "method_path",
    "worker_failure",
]

SERVICE: Final = "inference.GRPCInferenceService"

_NOT_CONNECTED: Final = "failed to connect to all addresses"
"""How gRPC core begins the UNAVAILABLE of a call that found no connection to its
address: the call was never sent (a call cut after it was sent says "Stream removed",
"Socket closed" or "Connection reset")."""


def method_path(rpc: str) -> str:
    """The HTTP/2 path of ``rpc`` on the inference service."""
    return f"/{SERVICE}/{rpc}"


class WorkerStatusError(Exception):
    """The worker ended the call with a status of its own: passed to the client as it is."""

    def __init__(self, code: grpc.StatusCode, details: str, metadata: Metadata) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.metadata = metadata


@dataclass(slots=True)
class Turn:
    """A call's replica, and the buffer's grant when it waited for one (released when the
    call's first answer arrives, letting the next waiter go)."""

    replica: Replica
    grant: Grant | None

    def responded(self) -> float | None:
        """Note the first answer; see :meth:`Grant.responded`. Releases the grant."""
        if self.grant is None:
            return None
        waited_s = self.grant.responded()
        self.grant.release()
        return waited_s

    def release(self) -> None:
        if self.grant is not None:
            self.grant.release()


class Dispatch:
    """Replica choice for gRPC calls, over the activator's one table, buffer and view.

    Parameters:
        catalog: which models are registered.
        table: the ready replicas.
        buffer: where calls wait while a model has no ready replica.
        view: told to forget a replica whose worker refused a connection.
        retry_after_s: carried by the errors this raises.
        read_timeout_s: bound on one call to a worker (the client's deadline may be shorter).
        sequences: where requests of a sequence stick to their replica; None routes them as
            any other request.
    """

    def __init__(
        self,
        catalog: ModelCatalog,
        table: ReplicaTable,
        buffer: Buffer,
        view: PlacementView,
        *,
        retry_after_s: int,
        read_timeout_s: float,
        sequences: SequenceBindings | None = None,
    ) -> None:
        self._catalog = catalog
        self.sequences = sequences
        self._table = table
        self._buffer = buffer
        self._view = view
        self.retry_after_s = retry_after_s
        self.read_timeout_s = read_timeout_s

    async def require(self, model: str) -> None:
        """Raise :class:`ModelNotRegisteredError` unless ``model`` is registered, and
        ``ModelFailedError`` when its load failed for good."""
        is_known = self._catalog.cached(model)
        if is_known is None:
            is_known = await self._catalog.is_registered(model)
        if not is_known:
            raise ModelNotRegisteredError(model=model)
        failure = self._catalog.failure(model)
        if failure is not None:
            raise ModelFailedError(model=model, reason=failure.reason, failed_at=failure.failed_at)

    async def take_turn(
        self,
        model: str,
        *,
        deadline: float,
        requeue: bool = False,
        sequence: SequenceTag | None = None,
    ) -> Turn:
        """A replica of ``model`` serving gRPC: the least busy one (for a request of
        ``sequence``, the sequence's), or one granted by the buffer before ``deadline``
        (event-loop time).

        Raises:
            ZeroserveError: the buffer's errors (full, activation failed, timed out),
                :class:`NoGrpcEndpointError` for a worker without gRPC, or
                :class:`SequenceLostError`.
        """
        if sequence is not None:
            replica = self.sequence_replica(model, sequence)
        else:
            # While the model has a queue, new calls join it rather than overtake it.
            replica = None if self._buffer.is_waiting(model) else self._table.choose(model)
        grant = None
        if replica is None:
            loop = asyncio.get_running_loop()
            waiting_since = loop.time()
            try:
                grant = await self._buffer.wait(model, deadline=deadline, requeue=requeue)
            finally:
                note_activation_wait(loop.time() - waiting_since)
            replica = grant.replica
            if sequence is not None:
                # The model has replicas now: the sequence's is the one its ID hashes to.
                replica = choose_for_key(self._table.replicas(model), sequence.correlation_id)
                replica = replica or grant.replica
        if not replica.grpc_address:
            if grant is not None:
                grant.release()
            raise NoGrpcEndpointError(
                model=model, worker_id=replica.worker_id, retry_after_s=self.retry_after_s
            )
        return Turn(replica, grant)

    def sequence_replica(self, model: str, sequence: SequenceTag) -> Replica | None:
        """The replica a request of ``sequence`` goes to: the one the sequence is bound to,
        else the one its ID hashes to; None while the model has none.

        Raises:
            SequenceLostError: the sequence is bound to a worker that no longer serves the
                model, and the request does not start it again.
        """
        assert self.sequences is not None
        worker_id = self.sequences.worker_of(model, sequence.correlation_id)
        if worker_id is not None:
            replica = self._table.get(model, worker_id)
            if replica is not None:
                return replica
            self.sequences.unbind(model, sequence.correlation_id)
            if not sequence.is_start:
                raise SequenceLostError(
                    model=model, correlation_id=sequence.correlation_id, worker_id=worker_id
                )
        return choose_for_key(self._table.replicas(model), sequence.correlation_id)

    def pinned_turn(self, model: str, worker_id: str, sequence: SequenceTag) -> Turn:
        """A turn on ``worker_id``'s replica of ``model``, where ``sequence`` was routed.

        Raises:
            SequenceLostError: that worker no longer serves the model.
            NoGrpcEndpointError: the worker serves no gRPC.
        """
        replica = self._table.get(model, worker_id)
        if replica is None:
            if self.sequences is not None:
                self.sequences.unbind(model, sequence.correlation_id)
            raise SequenceLostError(
                model=model, correlation_id=sequence.correlation_id, worker_id=worker_id
            )
        if not replica.grpc_address:
            raise NoGrpcEndpointError(
                model=model, worker_id=replica.worker_id, retry_after_s=self.retry_after_s
            )
        return Turn(replica, None)

    def sequence_sent(self, model: str, sequence: SequenceTag, worker_id: str) -> None:
        """A request of ``sequence`` went to ``worker_id``: bind the sequence there (or
        mark its binding used), or forget it at END."""
        if self.sequences is None:
            return
        if sequence.is_end:
            self.sequences.unbind(model, sequence.correlation_id)
        else:
            self.sequences.bind(model, sequence.correlation_id, worker_id)

    def not_sent(self, model: str, turn: Turn, error: grpc.aio.AioRpcError) -> bool:
        """Whether ``error`` says the worker never got the call; if so, the replica is
        left out for a while and the turn given back, and the call may go elsewhere."""
        if not is_not_connected(error):
            return False
        self.not_connected(model, turn)
        return True

    def not_connected(self, model: str, turn: Turn) -> None:
        """The turn's worker could not be reached: leave its replica out for a while and
        give the turn back."""
        # Forget first, so that giving the grant back cannot hand the same dead replica to
        # the next waiter.
        self._view.forget(model, turn.replica)
        turn.release()

    def timeout_s(self, time_remaining_s: float | None) -> float:
        """The deadline of a call to a worker: the client's, bounded by the read timeout."""
        if time_remaining_s is None:
            return self.read_timeout_s
        return max(min(time_remaining_s, self.read_timeout_s), 0.0)


def is_not_connected(error: grpc.aio.AioRpcError) -> bool:
    """Whether a grpc.aio call failed before its worker got it (no connection)."""
    return error.code() == grpc.StatusCode.UNAVAILABLE and (error.details() or "").startswith(
        _NOT_CONNECTED
    )


def worker_failure(
    model: str, replica: Replica, error: grpc.aio.AioRpcError, *, timeout_s: float
) -> Exception:
    """What the client gets for a grpc.aio call to ``replica`` that failed after it was
    sent (see :func:`status_failure`)."""
    metadata = tuple((key, value) for key, value in (error.trailing_metadata() or ()))
    return status_failure(
        model,
        replica.grpc_address,
        error.code(),
        error.details() or "",
        metadata,
        timeout_s=timeout_s,
    )


def status_failure(
    model: str,
    address: str,
    code: grpc.StatusCode,
    details: str,
    metadata: Metadata,
    *,
    timeout_s: float,
) -> Exception:
    """What the client gets for a call to the worker at ``address`` that ended with
    ``code`` after it was sent.

    UNAVAILABLE is the transport's (the worker died, reset or closed the connection) or the
    worker's own; either way the message names the worker. DEADLINE_EXCEEDED after the
    activator's own bound is the activator's timeout. Anything else is the worker's answer
    and passes through unchanged.
    """
    if code == grpc.StatusCode.UNAVAILABLE:
        return UpstreamError(model=model, url=address, reason=details or "unavailable")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return UpstreamTimeoutError(model=model, url=address, timeout_s=timeout_s)
    return WorkerStatusError(code, details, metadata)
