"""``triton_python_backend_utils`` as a model in a stub process imports it.

The stub puts this module into ``sys.modules`` under Triton's name before it imports
``model.py``; nothing installs a top-level ``triton_python_backend_utils`` package, so a
real one elsewhere is never shadowed. Names, signatures and error texts follow Triton's
Python backend (r24.10): ``Tensor``, ``InferenceRequest``, ``InferenceResponse``,
``TritonError`` with its codes, ``TritonModelException``, ``Logger``, ``ModelConfig``
and the helpers, so that models written for Triton run unchanged.

BLS (``InferenceRequest.exec`` and ``async_exec``, with ``decoupled=True`` an iterator
of responses) and response senders (decoupled models, or one response of a model that
is not) are answered by the stub's host, which talks to the server (:class:`Host`).
Custom metrics (``MetricFamily``, :mod:`.pb_metrics`) are kept by the server and shown
on its ``/metrics``. GPU memory (``PreferredMemory`` other than the default) is not
offered.

The parts with a job of their own live beside it and are re-exported here: the errors
(:mod:`.pb_errors`), the TRITONSERVER_* numbers (:mod:`.pb_constants`), tensors and
responses (:mod:`.pb_response`), the response sender (:mod:`.pb_sender`), the BLS
response iterator (:mod:`.pb_iterator`), the model config helpers (:mod:`.pb_config`) and
the custom metrics (:mod:`.pb_metrics`).
"""

from __future__ import annotations

import asyncio
import enum
import json
import sys
import threading
from collections.abc import Sequence
from typing import Any, Final, Protocol

import numpy as np

from runtimes.python_backend import tensors
from runtimes.python_backend.pb_config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    numpy_to_triton_type,
    triton_string_to_numpy,
    triton_to_numpy_type,
    using_decoupled_model_transaction_policy,
)
from runtimes.python_backend.pb_constants import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
)
from runtimes.python_backend.pb_errors import (
    ErrorCode as ErrorCode,
    TritonError,
    TritonModelException,
)
from runtimes.python_backend.pb_iterator import ResponseIterator
from runtimes.python_backend.pb_metrics import (
    Metric,
    MetricFamily,
    MetricHost,
    MetricKind,
    use_host_lookup,
)
from runtimes.python_backend.pb_response import InferenceResponse, PreferredMemory, Tensor
from runtimes.python_backend.pb_sender import InferenceResponseSender

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "Logger",
    "Metric",
    "MetricFamily",
    "MetricKind",
    "ModelConfig",
    "PreferredMemory",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "using_decoupled_model_transaction_policy",
]


class Host(Protocol):
    """What the module asks of the stub that runs it."""

    def log(self, level: str, message: str) -> None:
        """Write ``message`` to the server's log at ``level`` (INFO, WARNING, ERROR,
        VERBOSE)."""
        ...

    def is_cancelled(self, execution: int, index: int) -> bool:
        """Whether the client of request ``index`` of execution ``execution`` went away."""
        ...

    def model_dir(self) -> str:
        """The folder of ``model.py``."""
        ...

    @property
    def is_decoupled(self) -> bool:
        """The model's config says ``decoupled: true``."""
        ...

    def send_response(
        self, request: InferenceRequest, response: InferenceResponse | None, flags: int
    ) -> None:
        """Send one response of ``request`` (the sender's checks passed) and wait for the
        server to take it; TritonModelException when it refuses."""
        ...

    def call_model(
        self, request: InferenceRequest, decoupled: bool
    ) -> InferenceResponse | ResponseIterator:
        """Run a BLS request: its one response, or with ``decoupled`` an iterator of its
        responses. TritonModelException outside ``execute``."""
        ...

    def metric_call(self, operation: str, arguments: dict[str, Any]) -> float:
        """Run a custom-metric operation on the server (see :mod:`.pb_metrics`)."""
        ...

    def metric_delete(self, handle: int) -> None:
        """A metric object is gone; the server forgets its handle."""
        ...


class _Binding:
    # The stub process runs one model, and pb_utils' static API (Logger.log_info,
    # get_model_dir) has no object to carry the stub: one binding per process, set once.
    # In the server's process (zeroserve's in-process models) each model's executor
    # threads carry their model's metrics host instead.
    host: Host | None = None
    thread = threading.local()


def bind(host: Host) -> None:
    """Connect the module to its stub (called once, before ``model.py`` is imported)."""
    _Binding.host = host


def bind_thread_metrics(host: MetricHost) -> None:
    """Where metric objects made on the calling thread go (an in-process model's
    executor thread)."""
    _Binding.thread.metrics = host


def _bound_host() -> Host | None:
    return _Binding.host


def _metric_host() -> MetricHost | None:
    found: MetricHost | None = getattr(_Binding.thread, "metrics", None)
    return found if found is not None else _Binding.host


use_host_lookup(_metric_host)


class InferenceRequest:
    """A request ``execute`` receives (or, for BLS, one a model builds)."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        *,
        inputs: Sequence[Tensor],
        requested_output_names: Sequence[str],
        model_name: str,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        self._id = str(request_id)
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        # Models often pass names straight from a BYTES tensor, as Triton's accepts.
        self._requested = [_text(name) for name in requested_output_names]
        self._model_name = _text(model_name)
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = (
            parameters if isinstance(parameters, str) else _parameters_json(parameters or {})
        )
        self._execution: int | None = None
        self._index = 0
        self._sender: InferenceResponseSender[InferenceRequest] | None = None

    @classmethod
    def received(
        cls,
        *,
        execution: int,
        index: int,
        model_name: str,
        request_id: str,
        correlation_id: int | str,
        parameters: str,
        requested_output_names: Sequence[str],
        flags: int,
        inputs: Sequence[Tensor],
    ) -> InferenceRequest:
        """A request of execution ``execution`` (the stub builds these, one per request).

        The server's fields are already what the constructor would make of them (text,
        a list of names, parameters as JSON text), so they are set without its checks
        and conversions: a few microseconds on every request.
        """
        request = cls.__new__(cls)
        request._id = request_id
        request._correlation_id = correlation_id
        request._inputs = list(inputs)
        request._requested = list(requested_output_names)
        request._model_name = model_name
        request._model_version = -1
        request._flags = flags
        request._timeout = 0
        request._parameters = parameters
        request._execution, request._index = execution, index
        request._sender = None
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def position(self) -> tuple[int, int]:
        """The execution this request came in and its index there (received requests)."""
        if self._execution is None:
            raise TritonModelException("only a request execute received has a response sender")
        return self._execution, self._index

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as a JSON object text (reserved ones left out)."""
        return self._parameters

    def trace(self) -> InferenceTrace:
        return InferenceTrace()

    def requested_output_names(self) -> list[str]:
        """The outputs the client asked for (every configured one when it named none)."""
        return list(self._requested)

    def is_cancelled(self) -> bool:
        """Whether the client gave up on this request (asks the server)."""
        host = _Binding.host
        if self._execution is None or host is None:
            return False
        return host.is_cancelled(self._execution, self._index)

    def get_response_sender(self) -> InferenceResponseSender[InferenceRequest]:
        if self._sender is None:
            self._sender = InferenceResponseSender(self, _bound_host)
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        if flags != TRITONSERVER_REQUEST_RELEASE_ALL:
            raise TritonModelException(
                "request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) is not "
                "supported by zeroserve"
            )

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def exec(self, decoupled: bool = False) -> InferenceResponse | ResponseIterator:
        """Run this request on the server's model ``model_name`` (BLS) and wait for its
        response, or with ``decoupled`` for the first of its responses."""
        host = _Binding.host
        if host is None:
            raise TritonModelException("BLS is only supported during the 'execute' function.")
        return host.call_model(self, bool(decoupled))

    def async_exec(self, decoupled: bool = False) -> Any:
        """:meth:`exec` as an awaitable of the running event loop (an ``async def
        execute``), run in the loop's default executor as Triton's stub runs it."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, self.exec, decoupled)


class InferenceTrace:
    """A request's trace context; zeroserve passes none to models."""

    def get_context(self) -> str | None:
        return None


class Logger:
    """Writes to the server's log, as Triton's ``pb_utils.Logger`` does."""

    class LogLevel(enum.Enum):
        INFO = "INFO"
        WARNING = "WARNING"
        ERROR = "ERROR"
        VERBOSE = "VERBOSE"

    INFO: Final = LogLevel.INFO
    WARNING: Final = LogLevel.WARNING
    ERROR: Final = LogLevel.ERROR
    VERBOSE: Final = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: Logger.LogLevel = LogLevel.INFO) -> None:
        host = _Binding.host
        if host is None:
            print(f"[{level.value}] {message}", file=sys.stderr)
            return
        host.log(level.value, str(message))

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, Logger.LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, Logger.LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, Logger.LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, Logger.LogLevel.VERBOSE)


def get_model_dir() -> str:
    """The folder holding ``model.py`` (the version folder)."""
    host = _Binding.host
    if host is None:
        raise TritonModelException("get_model_dir() is only available inside a model")
    return host.model_dir()


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input named ``name``, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output named ``name``, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple[()] | None:
    """Triton's BYTES serialization of an object or bytes array (``()`` when empty,
    None for other dtypes)."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype.kind not in "OS":
        return None
    return tensors.serialize_bytes(input_tensor)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The flat object array of ``bytes`` a BYTES serialization holds."""
    return tensors.deserialize_bytes(encoded_tensor)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _parameters_json(parameters: dict[str, Any]) -> str:
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return json.dumps(parameters)
