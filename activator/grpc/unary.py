"""Forwarding one unary call (ModelInfer, ModelMetadata, ModelConfig, ModelStatistics) to a
replica of its model, the request and the answer as the bytes they came in.

The call counts as the model's traffic from its arrival (buffered time included) to its
answer, and in the chosen replica's in-flight count while it is with the worker. Its
deadline at the worker is the client's, bounded by ``upstream_read_timeout_s``; a client
that cancels cancels the call to the worker too. The client's metadata goes with it,
less what gRPC sets for each hop. A ModelInfer of a sequence (its ``sequence_id``
parameter) goes to the sequence's replica (:mod:`activator.grpc.dispatch`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import grpc

from activator.access_log import current_request_id, note_model
from activator.grpc.channels import WorkerChannels
from activator.grpc.dispatch import Dispatch, method_path, worker_failure
from activator.grpc.status import Metadata
from activator.grpc.wire import sequence_tag
from activator.traffic import Traffic
from foundation import request_ids

__all__ = ["UnaryForward", "forwarded_metadata"]


def forwarded_metadata(metadata: Iterable[tuple[str, Any]] | None) -> Metadata:
    """The client's metadata to pass on: all of it but gRPC's own per-hop keys and the
    caller's API key (the activator's to check and no worker's to see), with the call's
    ``x-request-id`` (the access log's, else the client's usable one, else a new one) in
    place of the client's."""
    request_id = current_request_id()
    kept: list[tuple[str, Any]] = []
    for key, value in metadata or ():
        if key in ("user-agent", "authorization") or key.startswith(("grpc-", ":")):
            continue
        if key == request_ids.METADATA_KEY:
            if request_id is None and isinstance(value, str) and request_ids.is_usable(value):
                request_id = value
            continue
        kept.append((key, value))
    kept.append((request_ids.METADATA_KEY, request_id or request_ids.new_request_id()))
    return tuple(kept)


class UnaryForward:
    """Sends unary calls to replicas over the workers' channels.

    Parameters:
        dispatch: the replica choice.
        channels: one channel per worker.
        traffic: counts each call from arrival to answer.
        activation_timeout_s: how long a call may wait in the buffer in all.
    """

    def __init__(
        self,
        dispatch: Dispatch,
        channels: WorkerChannels,
        traffic: Traffic,
        *,
        activation_timeout_s: float,
    ) -> None:
        self._dispatch = dispatch
        self._channels = channels
        self._traffic = traffic
        self._activation_timeout_s = activation_timeout_s

    async def __call__(
        self,
        model: str,
        rpc: str,
        request: bytes,
        context: grpc.aio.ServicerContext[bytes, bytes],
    ) -> bytes:
        """The worker's answer to ``request`` (serialized) for ``rpc`` on ``model``.

        Raises:
            ZeroserveError: unknown model, the buffer's errors, a worker that failed.
            WorkerStatusError: the worker's own error status.
        """
        await self._dispatch.require(model)
        note_model(model)
        self._traffic.begin(model)
        try:
            return await self._send(model, rpc, request, context)
        finally:
            self._traffic.end(model)

    async def _send(
        self,
        model: str,
        rpc: str,
        request: bytes,
        context: grpc.aio.ServicerContext[bytes, bytes],
    ) -> bytes:
        dispatch = self._dispatch
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._activation_timeout_s
        metadata = forwarded_metadata(context.invocation_metadata())
        path = method_path(rpc)
        sequence = None
        if rpc == "ModelInfer" and dispatch.sequences is not None:
            sequence = sequence_tag(request)
        requeue = False
        while True:
            turn = await dispatch.take_turn(
                model, deadline=deadline, requeue=requeue, sequence=sequence
            )
            replica = turn.replica
            address = replica.grpc_address
            timeout_s = dispatch.timeout_s(context.time_remaining())
            replica.in_flight += 1
            if not replica.awaiting_head:
                replica.progress_at = loop.time()
            replica.awaiting_head += 1
            channel = self._channels.acquire(address)
            send: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path)
            call = send(request, timeout=timeout_s, metadata=metadata)
            try:
                response: bytes = await call
            except grpc.aio.AioRpcError as exc:
                if dispatch.not_sent(model, turn, exc):
                    requeue = True
                    continue
                replica.progress_at = loop.time()
                turn.release()
                if sequence is not None:
                    dispatch.sequence_sent(model, sequence, replica.worker_id)
                raise worker_failure(model, replica, exc, timeout_s=timeout_s) from None
            except BaseException:
                # The client left (or the activator stops): the worker's call goes too.
                call.cancel()
                turn.release()
                raise
            finally:
                replica.awaiting_head -= 1
                replica.in_flight -= 1
                self._channels.release(address)
            replica.progress_at = loop.time()
            if sequence is not None:
                dispatch.sequence_sent(model, sequence, replica.worker_id)
            waited_s = turn.responded()
            if waited_s is not None:
                self._traffic.first_response(model, replica.worker_id, waited_s)
            return response
