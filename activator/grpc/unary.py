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
from typing import Any, Final

import grpc

from activator.access_log import current_request_id, note_model
from activator.errors import UpstreamBusyError, UpstreamError, UpstreamTimeoutError
from activator.grpc.channels import WorkerChannels
from activator.grpc.dispatch import (
    Dispatch,
    WorkerStatusError,
    is_not_connected,
    method_path,
    status_failure,
    worker_failure,
)
from activator.grpc.status import Metadata
from activator.grpc.wire import sequence_tag
from activator.lb import Replica
from activator.proxy import UPSTREAM_FAILURES, upstream_failure
from activator.traffic import Traffic
from activator.upstream import UpstreamConnectError, UpstreamPool, UpstreamResponse
from foundation import request_ids
from foundation.errors import ZeroserveError
from foundation.grpc_front.web import (
    CONTENT_TYPE,
    WebProtocolError,
    metadata_headers,
    parse_answer,
    request_body,
    timeout_header,
)

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
    """Sends unary calls to replicas, as gRPC-Web over the workers' HTTP connections
    (``pool``) or over their gRPC channels (``channels``).

    Parameters:
        dispatch: the replica choice.
        channels: one channel per worker.
        traffic: counts each call from arrival to answer.
        activation_timeout_s: how long a call may wait in the buffer in all.
        pool: the keep-alive HTTP/1.1 connections to workers; when given, calls go as
            gRPC-Web over them.
        max_answer_bytes: the largest answer message taken from a worker (gRPC-Web).
    """

    def __init__(
        self,
        dispatch: Dispatch,
        channels: WorkerChannels,
        traffic: Traffic,
        *,
        activation_timeout_s: float,
        pool: UpstreamPool | None = None,
        max_answer_bytes: int = 0,
    ) -> None:
        self._dispatch = dispatch
        self._channels = channels
        self._traffic = traffic
        self._activation_timeout_s = activation_timeout_s
        self._pool = pool
        self._max_answer_bytes = max_answer_bytes

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
        web: _WebCall | None = None
        if self._pool is not None:
            web = _WebCall(self._pool, path, request, metadata, self._max_answer_bytes)
        sequence = None
        if rpc == "ModelInfer" and dispatch.sequences is not None:
            sequence = sequence_tag(request)
        requeue = False
        while True:
            turn = await dispatch.take_turn(
                model, deadline=deadline, requeue=requeue, sequence=sequence
            )
            replica = turn.replica
            timeout_s = dispatch.timeout_s(context.time_remaining())
            replica.in_flight += 1
            if not replica.awaiting_head:
                replica.progress_at = loop.time()
            replica.awaiting_head += 1
            try:
                if web is not None:
                    response = await web.send(model, replica, timeout_s, dispatch.retry_after_s)
                else:
                    response = await self._send_on_channel(
                        model, replica, path, request, metadata, timeout_s
                    )
            except _NotSentError:
                dispatch.not_connected(model, turn)
                requeue = True
                continue
            except (ZeroserveError, WorkerStatusError) as exc:
                replica.progress_at = loop.time()
                turn.release()
                # A call that found every connection busy never reached the worker.
                if sequence is not None and not isinstance(exc, UpstreamBusyError):
                    dispatch.sequence_sent(model, sequence, replica.worker_id)
                raise
            except BaseException:
                # The client left (or the activator stops): the worker's call went with it.
                turn.release()
                raise
            finally:
                replica.awaiting_head -= 1
                replica.in_flight -= 1
            replica.progress_at = loop.time()
            if sequence is not None:
                dispatch.sequence_sent(model, sequence, replica.worker_id)
            waited_s = turn.responded()
            if waited_s is not None:
                self._traffic.first_response(model, replica.worker_id, waited_s)
            return response

    async def _send_on_channel(
        self,
        model: str,
        replica: Replica,
        path: str,
        request: bytes,
        metadata: Metadata,
        timeout_s: float,
    ) -> bytes:
        address = replica.grpc_address
        channel = self._channels.acquire(address)
        try:
            send: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path)
            call = send(request, timeout=timeout_s, metadata=metadata)
            try:
                response: bytes = await call
            except grpc.aio.AioRpcError as exc:
                if is_not_connected(exc):
                    raise _NotSentError from None
                raise worker_failure(model, replica, exc, timeout_s=timeout_s) from None
            except BaseException:
                call.cancel()
                raise
            return response
        finally:
            self._channels.release(address)


class _NotSentError(Exception):
    """The worker never got the call: it may go to another replica."""


_ANSWER_GRACE_S: Final = 1.0
"""How long past the call's deadline the activator waits for the worker's own
DEADLINE_EXCEEDED before it gives up on the connection."""


class _WebCall:
    """One unary call as gRPC-Web: the request's bytes are made once, whichever replica
    (or replicas, after one that could not be reached) it goes to."""

    __slots__ = ("_body", "_headers", "_max_answer_bytes", "_path", "_pool")

    def __init__(
        self,
        pool: UpstreamPool,
        path: str,
        request: bytes,
        metadata: Metadata,
        max_answer_bytes: int,
    ) -> None:
        self._pool = pool
        self._path = path
        self._body = request_body(request)
        self._headers = [(b"content-type", CONTENT_TYPE), *metadata_headers(metadata)]
        self._max_answer_bytes = max_answer_bytes

    async def send(
        self, model: str, replica: Replica, timeout_s: float, retry_after_s: int
    ) -> bytes:
        """The answer's one message.

        Raises:
            _NotSentError: the worker could not be reached.
            ZeroserveError: a busy pool, a worker that failed or did not answer in time.
            WorkerStatusError: the worker's own error status.
        """
        headers = [*self._headers, (b"grpc-timeout", timeout_header(timeout_s))]
        url = replica.url
        upstream: UpstreamResponse | None = None
        try:
            async with asyncio.timeout(timeout_s + _ANSWER_GRACE_S):
                upstream = await self._pool.request(url, "POST", self._path, headers, self._body)
                if upstream.is_complete:
                    body = upstream.take_buffered()
                else:
                    body = b"".join([chunk async for chunk in upstream.chunks()])
        except UpstreamConnectError:
            raise _NotSentError from None
        except TimeoutError:
            raise UpstreamTimeoutError(model=model, url=url, timeout_s=timeout_s) from None
        except UPSTREAM_FAILURES as exc:
            raise upstream_failure(
                exc, model=model, url=url, timeout_s=timeout_s, retry_after_s=retry_after_s
            ) from None
        finally:
            if upstream is not None:
                # Read to its end, the connection goes back to the pool; else it closes
                # (and the worker sees the call go).
                upstream.close()
        if upstream.status != 200:
            raise UpstreamError(model=model, url=url, reason=f"HTTP status {upstream.status}")
        try:
            answer = parse_answer(body, self._max_answer_bytes)
        except WebProtocolError as exc:
            raise UpstreamError(model=model, url=url, reason=str(exc)) from None
        if answer.code != grpc.StatusCode.OK:
            raise status_failure(
                model,
                url,
                answer.code,
                answer.message,
                answer.trailing_metadata,
                timeout_s=timeout_s,
            )
        if len(answer.messages) != 1:
            reason = f"a unary answer of {len(answer.messages)} messages"
            raise UpstreamError(model=model, url=url, reason=reason)
        return answer.messages[0]
