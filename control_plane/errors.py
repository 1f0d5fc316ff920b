"""The control plane's branch of the error tree, free of HTTP.

    ZeroserveError                    foundation.errors: the one root
    └── ControlPlaneError
        ├── InvalidInputError         the request is wrong as written (malformed JSON)
        │   ├── SchemaValidationError a field fails the admin schema; names the field
        │   └── InvalidRegistrationError  the stored model is one no worker could load
        ├── UnauthorizedError         missing or wrong admin token
        ├── ModelNotFoundError        no model registered under this name
        ├── KeyNotFoundError          no API key with this id
        ├── ConflictError             the state says otherwise (name taken)
        │   ├── ModelExistsError
        │   └── StoreConflictError    (store.base) the store's own create/update clash
        ├── ControlPlaneUnavailableError  try again later
        │   ├── NoCapacityError       no worker has room and none can be started or freed
        │   ├── ActivationTimeoutError  the activation did not finish in time
        │   ├── WorkerStartError      a worker did not come up
        │   ├── NotActingError        this replica does not hold the lease
        │   ├── RegistrationCheckUnavailableError  the model's store could not be read now
        │   ├── ActivationBackoffError  the last activation failed for a passing reason;
        │   │                         the next one waits its backoff
        │   ├── StoreUnavailableError (store.errors) the state store did not answer
        │   └── KubeApiError          (backends.knative.errors) a Kubernetes API call failed
        ├── WorkerCallError           a worker could not be reached, or failed what it was asked
        │   └── LoadFailedError       the worker refused or failed the load
        └── KnativeConfigError        (backends.knative.errors) Knative lacks what pools need

The state store's failures (``store.errors``) are leaves here too, so ``except
ZeroserveError`` catches them with the rest; the admin API still answers them with texts of
their own (``api.app``), and the loops that survive an outage catch them by name.
``control_plane.api.http_errors`` maps each class to a status code in one place.
"""

from __future__ import annotations

from collections.abc import Sequence

from foundation.errors import ZeroserveError

__all__ = [
    "ActivationBackoffError",
    "ActivationTimeoutError",
    "ConflictError",
    "ControlPlaneError",
    "ControlPlaneUnavailableError",
    "InvalidInputError",
    "InvalidRegistrationError",
    "KeyNotFoundError",
    "LoadFailedError",
    "ModelExistsError",
    "ModelNotFoundError",
    "NoCapacityError",
    "NotActingError",
    "RegistrationCheckUnavailableError",
    "SchemaValidationError",
    "UnauthorizedError",
    "WorkerCallError",
    "WorkerStartError",
]


class ControlPlaneError(ZeroserveError):
    """Base of every error the control plane raises on purpose."""


class InvalidInputError(ControlPlaneError):
    """The request cannot be read: malformed JSON, or not a JSON object."""


class SchemaValidationError(InvalidInputError):
    """A request field fails validation; ``fields`` are dotted paths to each field at fault."""

    def __init__(self, *, errors: Sequence[tuple[str, str]]) -> None:
        self.fields = tuple(field for field, _ in errors)
        self.errors = tuple(errors)
        super().__init__("; ".join(f"{field}: {reason}" for field, reason in errors))


class InvalidRegistrationError(InvalidInputError):
    """The stored model of registration ``model`` is one no worker could load; the
    message is the worker's own words for the load that would fail."""

    def __init__(self, *, model: str, message: str) -> None:
        super().__init__(message)
        self.model = model


class UnauthorizedError(ControlPlaneError):
    """The admin token is missing or wrong."""

    def __init__(self, *, reason: str) -> None:
        super().__init__(reason)


class ModelNotFoundError(ControlPlaneError):
    """No model is registered under ``model``."""

    def __init__(self, *, model: str) -> None:
        super().__init__(f"model '{model}' is not registered")
        self.model = model


class KeyNotFoundError(ControlPlaneError):
    """No API key has the public id ``key_id``."""

    def __init__(self, *, key_id: str) -> None:
        super().__init__(f"no API key with id '{key_id}'")
        self.key_id = key_id


class ConflictError(ControlPlaneError):
    """The request clashes with the current state."""


class ModelExistsError(ConflictError):
    """A model named ``model`` is registered already."""

    def __init__(self, *, model: str) -> None:
        super().__init__(f"model '{model}' is registered already")
        self.model = model


class ControlPlaneUnavailableError(ControlPlaneError):
    """The control plane cannot do this now; a retry later may succeed."""

    retry_after_s: int = 1


class NoCapacityError(ControlPlaneUnavailableError):
    """No worker can take ``model``: all are full, busy and at ``max_workers``."""

    retry_after_s = 5

    def __init__(self, *, model: str, reason: str) -> None:
        super().__init__(f"no worker can take model '{model}': {reason}")
        self.model = model
        self.reason = reason


class ActivationTimeoutError(ControlPlaneUnavailableError):
    """Bringing ``model`` up took longer than ``timeout_s``."""

    retry_after_s = 5

    def __init__(self, *, model: str, timeout_s: float) -> None:
        super().__init__(f"activation of model '{model}' did not finish within {timeout_s:g} s")
        self.model = model
        self.timeout_s = timeout_s


class WorkerStartError(ControlPlaneUnavailableError):
    """A worker of ``pool`` did not start."""

    retry_after_s = 5

    def __init__(self, *, pool: str, reason: str) -> None:
        super().__init__(f"a worker of pool '{pool}' did not start: {reason}")
        self.pool = pool
        self.reason = reason


class NotActingError(ControlPlaneUnavailableError):
    """This control-plane replica does not hold the lease, so it does not act."""

    retry_after_s = 2

    def __init__(self) -> None:
        super().__init__("this control-plane replica is not acting; the acting replica will")


class RegistrationCheckUnavailableError(ControlPlaneUnavailableError):
    """The stored model of ``model`` could not be read to check it (the store is
    unreachable or slow); nothing was registered or changed."""

    retry_after_s = 5

    def __init__(self, *, model: str, reason: str) -> None:
        super().__init__(f"cannot check model '{model}' now: {reason}")
        self.model = model
        self.reason = reason


class ActivationBackoffError(ControlPlaneUnavailableError):
    """The last activation of ``model`` failed for a reason that may pass (``reason``);
    the next one starts after ``retry_after_s``."""

    def __init__(self, *, model: str, reason: str, retry_after_s: int) -> None:
        super().__init__(
            f"model '{model}' could not be activated ({reason}); the next attempt starts in "
            f"{retry_after_s} s"
        )
        self.model = model
        self.reason = reason
        self.retry_after_s = retry_after_s


class WorkerCallError(ControlPlaneError):
    """A worker could not be reached, or failed while doing what it was asked."""

    def __init__(self, *, worker: str, reason: str) -> None:
        super().__init__(f"worker {worker}: {reason}")
        self.worker = worker
        self.reason = reason


class LoadFailedError(WorkerCallError):
    """The worker refused or failed to load ``model``; ``reason`` is its own message.

    ``is_permanent`` when the worker said the load cannot succeed as registered (a config
    or layout error, missing files, the model's code raising: a 4xx answer), as opposed to
    a failure that may pass (the store unreachable: a 503)."""

    def __init__(
        self,
        *,
        model: str,
        worker: str,
        reason: str,
        is_permanent: bool = False,
        worker_message: str | None = None,
    ) -> None:
        super().__init__(worker=worker, reason=f"loading model '{model}' failed: {reason}")
        self.model = model
        self.reason = reason
        self.is_permanent = is_permanent
        self.worker_message = worker_message or reason
        """The worker's error text alone (no status, no worker id)."""
