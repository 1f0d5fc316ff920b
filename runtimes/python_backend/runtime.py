"""Triton Python-backend models in stub processes, behind :class:`ModelRuntime`.

One stub process per model instance (``instance_group`` count). The batcher hands this
runtime its batches as separate requests (:class:`RequestExecutor`): each execution
borrows an idle stub, whose ``execute`` gets the list of ``pb_utils.InferenceRequest`` and
returns one response per request; an error response fails that request alone, an
exception fails the whole execution with Triton's text.

A stub that dies (a crash, ``os._exit``, the OOM killer) or overruns its execute timeout
fails its execution's requests with Triton's ``Stub process '<instance>' is not
healthy.``, and the runtime tells whoever subscribed through :meth:`on_failure` (the
repository takes the version out of service; it can be loaded again). Unloading
finalizes and ends every stub, which returns all their memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

import numpy as np

from foundation import model_config
from foundation.errors import ZeroserveError
from foundation.proto import model_config_pb2 as mc
from runtimes.base import ModelRuntime, RuntimeOptions, RuntimeState, model_file
from runtimes.capabilities import Capabilities
from runtimes.errors import (
    InternalError,
    InvalidArgumentError,
    ModelLoadError,
    ModelNotReadyError,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
)
from runtimes.model_request import ModelRequest, RequestContext, RequestOutcome
from runtimes.python_backend import environment, process
from runtimes.python_backend.arena import ArenaFullError
from runtimes.python_backend.limits import StubLimits, limits_for
from runtimes.python_backend.messages import Message
from runtimes.python_backend.process import StubDeadError, StubProcess

logger = logging.getLogger(__name__)

DEFAULT_FILENAME: Final = "model.py"

_ERROR_KINDS: Final[Mapping[str, type[ZeroserveError]]] = {
    "INTERNAL": InternalError,
    "INVALID_ARG": InvalidArgumentError,
    "NOT_FOUND": NotFoundError,
    "UNAVAILABLE": UnavailableError,
    "UNSUPPORTED": UnsupportedError,
    # Triton's HTTP front end answers these three 400, as it does INVALID_ARG.
    "UNKNOWN": InvalidArgumentError,
    "ALREADY_EXISTS": InvalidArgumentError,
    "CANCELLED": InvalidArgumentError,
}
"""A response's TritonError code -> the error class the client's answer comes from."""
_PARAMETERS_JSON: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
"""Triton's text of a request's parameters: compact, UTF-8 left as is (built once: an
encoder per request would cost microseconds on every request)."""


class StubRuntime(ModelRuntime):
    """Runs a Triton Python-backend ``model.py`` in one stub process per instance.

    Thread-safety: everything runs on the event loop; :meth:`execute_requests` may be
    awaited concurrently up to the instance count.
    """

    kind = "python"
    model_filename = DEFAULT_FILENAME

    def __init__(self, *, name: str, version: int, options: RuntimeOptions) -> None:
        super().__init__(name=name, version=version, options=options)
        self._stubs: list[StubProcess] = []
        self._idle: asyncio.Queue[StubProcess] | None = None
        self._outputs: tuple[str, ...] = ()
        self._failure_callbacks: list[Callable[[str], None]] = []

    async def load(self, model_dir: Path, config: mc.ModelConfig, device: str) -> None:
        """Start one stub per instance and ``initialize`` each (concurrently).

        Raises :class:`ModelLoadError` with Triton's load error text when ``model.py``
        fails to import or ``initialize`` raises; every stub started is ended first.
        """
        if self.state is not RuntimeState.NEW:
            raise RuntimeError(f"load() called on a runtime in state {self.state.value}")
        self.state = RuntimeState.LOADING
        path = model_file(
            model_dir, config.default_model_filename or DEFAULT_FILENAME, model=self.name
        )
        try:
            limits = limits_for(config)
            command = await asyncio.to_thread(environment.stub_command, config, model_dir.parent)
        except (ValueError, environment.ExecutionEnvError) as exc:
            self.state = RuntimeState.FAILED
            raise ModelLoadError(model=self.name, reason=str(exc)) from exc
        group = config.instance_group[0]
        names = [f"{group.name or self.name + '_0'}_{i}" for i in range(max(group.count, 1))]
        is_gpu = group.kind == mc.ModelInstanceGroup.KIND_GPU
        base_args = {
            "model_config": json.dumps(model_config.to_json(config)),
            "model_instance_kind": "GPU" if is_gpu else "CPU",
            "model_instance_device_id": device.partition(":")[2] or "0",
            "model_repository": str(model_dir.parent),
            "model_version": str(self.version),
            "model_name": self.name,
        }
        init = {
            "kind": "init",
            "path": str(path),
            "version": model_dir.name,
            "model": self.name,
            "decoupled": config.model_transaction_policy.decoupled,
            "call_timeout_s": limits.execute_timeout_s,
            "native_threads": limits.native_threads,
        }
        results = await asyncio.gather(
            *(self._start(name, command, limits, init, base_args) for name in names),
            return_exceptions=True,
        )
        self._stubs = [r for r in results if isinstance(r, StubProcess)]
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await self._close_all(finalize=False)
            self.state = RuntimeState.FAILED
            raise failure
        self._idle = asyncio.Queue(maxsize=len(self._stubs))
        for stub in self._stubs:
            self._idle.put_nowait(stub)
        self._outputs = tuple(output.name for output in config.output)
        self.state = RuntimeState.READY
        logger.info(
            "loaded Triton Python model %s version %s in %d stub processes",
            self.name,
            self.version,
            len(self._stubs),
            extra={"model": self.name, "version": self.version, "device": device},
        )

    async def _start(
        self,
        name: str,
        command: process.StubCommand,
        limits: StubLimits,
        init: Message,
        base_args: Mapping[str, str],
    ) -> StubProcess:
        try:
            started = await asyncio.to_thread(process.start, name, command, limits)
        except process.StubError as exc:
            raise ModelLoadError(model=self.name, reason=str(exc)) from exc
        stub = StubProcess(
            started,
            limits,
            on_death=self._stub_died,
            caller=self.options.models,
            response_error=response_error,
            metrics=self.options.custom_metrics,
        )
        try:
            await stub.open()
            args = {**base_args, "model_instance_name": name}
            reply = await stub.call(
                {**init, "name": name, "args": args}, "init_done", limits.load_timeout_s
            )
        except BaseException as exc:
            await stub.close()
            if isinstance(exc, TimeoutError):
                raise ModelLoadError(
                    model=self.name,
                    reason=f"initialize of {name} did not finish within {limits.load_timeout_s} s",
                ) from None
            if isinstance(exc, StubDeadError):
                raise ModelLoadError(
                    model=self.name, reason=f"the Python stub {name} died while loading"
                ) from None
            raise
        error = reply.get("error")
        if error is not None:
            await stub.close()
            # Triton's words, so that clients matching on them keep working.
            raise ModelLoadError(
                model=self.name,
                reason=f"version {self.version} is at UNAVAILABLE state: Internal: {error};\n",
            )
        return stub

    async def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run ``batch`` as one request asking for every output; see :class:`ModelRuntime`.

        Raises the request's error, or the execution's (InternalError with Triton's text).
        """
        context = RequestContext(requested_outputs=self._outputs)
        (outcome,) = await self.execute_requests([ModelRequest(batch, context)])
        if isinstance(outcome, ZeroserveError):
            raise outcome
        return outcome

    async def execute_requests(self, requests: Sequence[ModelRequest]) -> list[RequestOutcome]:
        """One ``execute`` on an idle stub; see :class:`~runtimes.model_request.RequestExecutor`."""
        idle = self._idle
        if self.state is not RuntimeState.READY or idle is None:
            raise ModelNotReadyError(f"model '{self.name}' version {self.version} is not ready")
        try:
            stub = idle.get_nowait()
        except asyncio.QueueEmpty:
            raise InternalError("no idle Python stub; more executions than instances") from None
        try:
            entries = [_entry(request.context) for request in requests]
            contexts = [request.context for request in requests]
            try:
                reply = await stub.execute(entries, [r.inputs for r in requests], contexts)
            except StubDeadError as exc:
                raise InternalError(str(exc)) from None
            except ArenaFullError as exc:
                raise InternalError(str(exc)) from None
        finally:
            idle.put_nowait(stub)
        error = reply.get("error")
        if error is not None:
            raise InternalError(str(error))
        return [
            {} if request.context.responses is not None else _outcome(response, stub.name, index)
            for index, (request, response) in enumerate(
                zip(requests, reply["responses"], strict=True)
            )
        ]

    def on_failure(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` once if a stub dies while the model serves."""
        self._failure_callbacks.append(callback)

    def resolve_capabilities(self) -> Capabilities:
        return Capabilities(requests=self, failure=self)

    async def unload(self) -> None:
        """Finalize and end every stub (bounded), freeing their memory; idempotent."""
        if self.state in (RuntimeState.UNLOADED, RuntimeState.UNLOADING):
            return
        self.state = RuntimeState.UNLOADING
        await self._close_all(finalize=True)
        self.state = RuntimeState.UNLOADED
        logger.info(
            "unloaded Triton Python model %s version %s",
            self.name,
            self.version,
            extra={"model": self.name, "version": self.version},
        )

    async def _close_all(self, *, finalize: bool) -> None:
        stubs, self._stubs, self._idle = self._stubs, [], None
        message = {"kind": "finalize"} if finalize else None
        await asyncio.gather(*(stub.close(message, "finalize_done") for stub in stubs))

    def _stub_died(self, reason: str) -> None:
        if self.state is not RuntimeState.READY:
            return
        self.state = RuntimeState.FAILED
        logger.error(
            "Python model %s version %s failed: %s",
            self.name,
            self.version,
            reason,
            extra={"model": self.name, "version": self.version},
        )
        callbacks, self._failure_callbacks = self._failure_callbacks, []
        for callback in callbacks:
            try:
                callback(reason)
            except Exception:
                logger.exception("a failure callback of model %s failed", self.name)


def _entry(context: RequestContext) -> Message:
    return {
        "id": context.request_id,
        "correlation_id": context.correlation_id,
        "parameters": _PARAMETERS_JSON.encode(dict(context.parameters))
        if context.parameters
        else "{}",
        "requested": list(context.requested_outputs),
        "flags": context.flags,
    }


def _outcome(response: Message | None, stub: str, index: int) -> RequestOutcome:
    if response is None:
        return InternalError(
            f"Python model instance '{stub}' sent no response for request {index}: execute "
            "returned none for it and its response sender sent none"
        )
    error = response.get("error")
    if error is not None:
        return response_error(error)
    arrays: dict[str, np.ndarray] = response["arrays"]
    return arrays


def response_error(error: Message) -> ZeroserveError:
    """The error a response's ``{code, message}`` gives its client."""
    kind = _ERROR_KINDS.get(str(error.get("code")), InternalError)
    return kind(str(error.get("message", "")))
