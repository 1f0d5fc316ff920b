"""The activator's branch of the error tree, free of HTTP.

    ZeroserveError                    foundation.errors: the one root
    └── ActivatorError
        ├── UnroutableRequestError    the request cannot be routed (no model in an OpenAI body)
        │   └── RequestTooLargeError  the body exceeds ``max_request_bytes``
        ├── ModelNotRegisteredError   no model of this name is registered
        ├── ClientClosedError         the client left before its request was read
        ├── UnauthenticatedError      no API key, or one that is malformed, unknown, expired
        │                             or revoked
        ├── ForbiddenModelError       the key may not call this model (existing or not)
        ├── TooManyRequestsError      try again later, somewhere else
        │   ├── BufferFullError       the model's buffer holds ``buffer_max_requests``
        │   └── QuotaExceededError    the key is over one of its limits
        ├── ActivatorUnavailableError try again later
        │   ├── ActivationFailedError the control plane could not be asked, or refused
        │   ├── ColdStartTimeoutError no replica became ready before the deadline
        │   ├── UpstreamBusyError     every upstream connection stayed busy
        │   ├── NoGrpcEndpointError   a gRPC call found a replica whose worker serves no gRPC
        │   ├── CatalogUnavailableError  the state store did not answer a model lookup
        │   ├── KeyLookupUnavailableError  the state store did not answer a key lookup
        │   └── ShuttingDownError     the activator stops and gave up waiting
        ├── SequenceLostError         the worker a sequence runs on no longer serves its model
        ├── UpstreamError             the worker dropped the request after receiving it
        └── UpstreamTimeoutError      the worker took the request and did not answer in time

`activator.http_errors` maps each class to a status code in one place.
"""

from __future__ import annotations

from foundation.errors import ZeroserveError


class ActivatorError(ZeroserveError):
    """Base of every error the activator raises on purpose."""


class UnroutableRequestError(ActivatorError):
    """The request is malformed in a way that keeps it from being routed."""


class RequestTooLargeError(UnroutableRequestError):
    """The request body is larger than the activator holds."""

    def __init__(self, *, size: int, limit: int) -> None:
        super().__init__(f"request body of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class ModelNotRegisteredError(ActivatorError):
    """No model of this name is registered."""

    def __init__(self, *, model: str) -> None:
        super().__init__(f"model '{model}' is not registered")
        self.model = model


class ClientClosedError(ActivatorError):
    """The client closed the connection before its request body was read: no server fault,
    and nobody will read the answer (nginx's 499 "client closed request")."""

    def __init__(self, *, path: str) -> None:
        super().__init__(f"the client closed the connection before sending all of {path}")
        self.path = path


class UnauthenticatedError(ActivatorError):
    """The request carries no usable API key. ``reason`` says which way it fails, never
    what the key was."""

    def __init__(self, *, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ForbiddenModelError(ActivatorError):
    """The request's key may not call ``model``. Said the same way whether the model is
    registered or not, so that a key learns nothing about models outside its scope."""

    def __init__(self, *, model: str, key_id: str) -> None:
        super().__init__(f"this API key may not call model '{model}'")
        self.model = model
        self.key_id = key_id


class TooManyRequestsError(ActivatorError):
    """More requests than the activator takes on; retry after ``retry_after_s``."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BufferFullError(TooManyRequestsError):
    """The model has no ready replica and its buffer is full."""

    def __init__(self, *, model: str, limit: int, retry_after_s: int) -> None:
        super().__init__(
            f"model '{model}' is starting and its request buffer is full "
            f"({limit} requests waiting)",
            retry_after_s=retry_after_s,
        )
        self.model = model
        self.limit = limit


class QuotaExceededError(TooManyRequestsError):
    """The request's key is over ``limit`` (``"requests_per_s"``, ``"max_in_flight"`` or
    ``"activations_per_hour"``) with ``value``; retry after ``retry_after_s``."""

    _WHAT: dict[str, str] = {
        "requests_per_s": "requests per second",
        "max_in_flight": "requests in flight",
        "activations_per_hour": "model activations (cold starts) per hour",
    }

    def __init__(self, *, key_id: str, limit: str, value: float, retry_after_s: int) -> None:
        super().__init__(
            f"API key {key_id} is over its limit of {value:g} {self._WHAT.get(limit, limit)}",
            retry_after_s=retry_after_s,
        )
        self.key_id = key_id
        self.limit = limit
        self.value = value


class ActivatorUnavailableError(ActivatorError):
    """The request cannot be served now; a retry after ``retry_after_s`` may succeed."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ActivationFailedError(ActivatorUnavailableError):
    """Asking the control plane to bring the model up failed."""

    def __init__(self, *, model: str, reason: str, retry_after_s: int) -> None:
        super().__init__(
            f"model '{model}' could not be activated: {reason}", retry_after_s=retry_after_s
        )
        self.model = model
        self.reason = reason


class ColdStartTimeoutError(ActivatorUnavailableError):
    """The request waited ``timeout_s`` and no replica of the model became ready."""

    def __init__(self, *, model: str, timeout_s: float, retry_after_s: int) -> None:
        super().__init__(
            f"model '{model}' did not become ready within {timeout_s:g} s",
            retry_after_s=retry_after_s,
        )
        self.model = model
        self.timeout_s = timeout_s


class UpstreamBusyError(ActivatorUnavailableError):
    """No connection to a worker came free within the pool timeout."""

    def __init__(self, *, model: str, retry_after_s: int) -> None:
        super().__init__(
            f"model '{model}': every connection to its workers is busy",
            retry_after_s=retry_after_s,
        )
        self.model = model


class NoGrpcEndpointError(ActivatorUnavailableError):
    """The replica chosen for a gRPC call is on a worker that serves no gRPC (one started
    before its backend gave workers a gRPC port)."""

    def __init__(self, *, model: str, worker_id: str, retry_after_s: int) -> None:
        super().__init__(
            f"model '{model}': worker {worker_id} serves no gRPC", retry_after_s=retry_after_s
        )
        self.model = model
        self.worker_id = worker_id


class CatalogUnavailableError(ActivatorUnavailableError):
    """The state store failed to say whether a model is registered."""

    def __init__(self, *, model: str, reason: str, retry_after_s: int) -> None:
        super().__init__(
            f"cannot look up model '{model}': state store unavailable ({reason})",
            retry_after_s=retry_after_s,
        )
        self.model = model
        self.reason = reason


class KeyLookupUnavailableError(ActivatorUnavailableError):
    """The state store failed to say whether an API key is valid (and it was not cached)."""

    def __init__(self, *, reason: str, retry_after_s: int) -> None:
        super().__init__(
            f"cannot check the API key: state store unavailable ({reason})",
            retry_after_s=retry_after_s,
        )
        self.reason = reason


class ShuttingDownError(ActivatorUnavailableError):
    """The activator is stopping and no longer waits for replicas."""

    def __init__(self, *, model: str, retry_after_s: int) -> None:
        super().__init__(
            f"model '{model}': the activator is shutting down", retry_after_s=retry_after_s
        )
        self.model = model


class SequenceLostError(ActivatorError):
    """A request of a sequence whose worker no longer serves the model (it died, or the
    model was taken from it): the sequence's state went with it, so no other replica can
    continue it. Retrying is no use; the client starts the sequence again."""

    def __init__(self, *, model: str, correlation_id: int | str, worker_id: str) -> None:
        super().__init__(
            f"sequence {correlation_id} of model '{model}' was running on worker {worker_id}, "
            "which no longer serves the model: its state is lost; start the sequence again "
            "(sequence_start)"
        )
        self.model = model
        self.correlation_id = correlation_id
        self.worker_id = worker_id


class UpstreamError(ActivatorError):
    """The worker failed after the request was sent: reset, closed or garbled."""

    def __init__(self, *, model: str, url: str, reason: str) -> None:
        super().__init__(f"model '{model}': worker {url} failed: {reason}")
        self.model = model
        self.url = url
        self.reason = reason


class UpstreamTimeoutError(ActivatorError):
    """The worker accepted the request and did not answer within the read timeout."""

    def __init__(self, *, model: str, url: str, timeout_s: float) -> None:
        super().__init__(f"model '{model}': worker {url} did not answer within {timeout_s:g} s")
        self.model = model
        self.url = url
        self.timeout_s = timeout_s
