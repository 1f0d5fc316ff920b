"""``triton_python_backend_utils.InferenceResponseSender``: a request's responses sent
while (or, for a decoupled model, after) ``execute`` runs, checked by Triton's rules."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from runtimes.python_backend.pb_constants import TRITONSERVER_RESPONSE_COMPLETE_FINAL
from runtimes.python_backend.pb_errors import TritonModelException
from runtimes.python_backend.pb_response import InferenceResponse


class SenderRequest(Protocol):
    """What a sender asks of its request."""

    def position(self) -> tuple[int, int]:
        """The request's execution and index; TritonModelException for one a model built."""
        ...

    def is_cancelled(self) -> bool: ...


RequestT = TypeVar("RequestT", bound=SenderRequest)
RequestT_contra = TypeVar("RequestT_contra", bound=SenderRequest, contravariant=True)


class ResponseHost(Protocol[RequestT_contra]):
    """What a sender asks of the stub's host (pb_utils' ``Host`` is one)."""

    @property
    def is_decoupled(self) -> bool: ...

    def send_response(
        self, request: RequestT_contra, response: InferenceResponse | None, flags: int
    ) -> None: ...


class InferenceResponseSender(Generic[RequestT]):
    """Sends a request's responses: any number for a decoupled model, the last one with
    ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; at most one for a model that is not.

    ``host()`` is the stub's host, looked up at each send (None outside a stub)."""

    def __init__(
        self, request: RequestT, host: Callable[[], ResponseHost[RequestT] | None]
    ) -> None:
        self._request = request
        self._host = host
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (TRITONSERVER_RESPONSE_COMPLETE_FINAL, 0):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        host = self._host()
        # Only a request execute received has a position, and with it a place to answer.
        try:
            self._request.position()
        except TritonModelException:
            host = None
        if host is None:
            raise TritonModelException(
                "Unable to send response. Response sender has no reference to the decoupled "
                "state of the model."
            )
        self.count(response, flags, is_decoupled=host.is_decoupled)
        host.send_response(self._request, response, flags)

    def count(self, response: InferenceResponse | None, flags: int, *, is_decoupled: bool) -> None:
        """Check that ``response`` may be sent now and count it (Triton's rules and texts)."""
        with self._lock:
            if not is_decoupled:
                if response is not None and self._sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than "
                        "one response."
                    )
                if response is None and flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                    if self._sent == 0:
                        raise TritonModelException(
                            "Unable to send response. Non-decoupled model cannot send "
                            "complete final before sending a response."
                        )
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._closed = True
            self._sent += 1

    def close(self) -> None:
        """No more responses (the execution failed: the server answered for it)."""
        with self._lock:
            self._closed = True

    @property
    def has_sent(self) -> bool:
        return self._sent > 0

    def is_cancelled(self) -> bool:
        return self._request.is_cancelled()
