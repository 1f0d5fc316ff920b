"""Models calling models (Triton's BLS): a Python model's ``InferenceRequest.exec`` runs
on the server's models through the same path a client's request takes, so the called
model's batcher, statistics and checks apply.

Failures read as Triton's Python backend gives them to the calling model: what the
request alone is refused for (an unknown or unready model, a decoupled model called
without ``decoupled=True``, inputs that do not fit) as INTERNAL, prefixed ``Model <name> -
Error when running inference: ``; what the called model answers, with its own code and
text. A decoupled model's responses come one by one, the last one final.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any

import numpy as np

from data_plane import inference
from data_plane.errors import InternalError, ZeroserveError
from data_plane.protocol import InferInput, InferRequest, OutputTensor, RequestedOutput
from data_plane.repository import LoadedVersion, ModelRepository
from foundation.datatypes import protocol_from_numpy
from runtimes.model_request import ModelCall, StreamedResponse

_SEQUENCE_START = 1
_SEQUENCE_END = 2


class ModelCalls:
    """Runs models' calls on the models of one repository (a
    :class:`~runtimes.model_request.ModelCaller`).

    Built before the repository it serves (runtimes are given it when they are built),
    then attached to it; a call before that is refused like a call to an unknown model.
    """

    def __init__(self) -> None:
        self._repository: ModelRepository | None = None

    def attach(self, repository: ModelRepository) -> None:
        """Serve calls with the models of ``repository``."""
        self._repository = repository

    async def call(self, call: ModelCall) -> AsyncGenerator[StreamedResponse, None]:
        """The responses to ``call``; see :class:`~runtimes.model_request.ModelCaller`."""
        prefix = f"Model {call.model} - Error when running inference: "
        model = self._model(call)
        if model is None:
            yield _failed(
                prefix + "Failed for execute the inference request. "
                f"Model '{call.model}' is not ready."
            )
            return
        decoupled = model.config.model_transaction_policy.decoupled
        if decoupled and not call.is_decoupled:
            yield _failed(
                f"{prefix}Model {call.model} is using the decoupled. The current BLS request "
                "call doesn't support models using the decoupled transaction policy. Please "
                "use 'decoupled=True' argument to the 'exec' or 'async_exec' calls for "
                "decoupled models.'"
            )
            return
        try:
            request = _request(call)
            if decoupled:
                stream = inference.open_stream(model, request)
            else:
                inference.check_request(model, request)
        except ZeroserveError as exc:
            yield _failed(prefix + exc.message)
            return
        if not decoupled:
            try:
                outputs = await inference.infer(model, request)
            except ZeroserveError as exc:
                yield StreamedResponse({}, exc, True)
                return
            yield StreamedResponse(_arrays(outputs), None, True)
            return
        try:
            async for answer in stream:
                yield StreamedResponse(_arrays(answer.outputs), answer.error, answer.is_final)
                if answer.is_final:
                    return
        finally:
            await stream.aclose()

    def _model(self, call: ModelCall) -> LoadedVersion | None:
        repository = self._repository
        if repository is None:
            return None
        try:
            return repository.get(call.model, None if call.version < 0 else call.version)
        except ZeroserveError:
            return None


def _request(call: ModelCall) -> InferRequest:
    inputs = []
    for name, array in call.inputs.items():
        data = np.asarray(array)
        inputs.append(InferInput(name, _datatype(data), tuple(data.shape), data))
    parameters: dict[str, Any] = dict(call.parameters)
    if call.correlation_id:
        parameters["sequence_id"] = call.correlation_id
    if call.flags & _SEQUENCE_START:
        parameters["sequence_start"] = True
    if call.flags & _SEQUENCE_END:
        parameters["sequence_end"] = True
    outputs = [RequestedOutput(name) for name in call.requested_outputs] or None
    return InferRequest(
        call.request_id or None, inputs, outputs, parameters, False, 0, call.timeout_us
    )


def _datatype(data: np.ndarray) -> str:
    if data.dtype.kind in "OSU":
        return "BYTES"
    try:
        return protocol_from_numpy(data.dtype)
    except (KeyError, ValueError):
        raise InternalError(f"numpy dtype {data.dtype} has no Triton datatype") from None


def _arrays(outputs: list[OutputTensor]) -> Mapping[str, np.ndarray]:
    return {output.name: output.data for output in outputs}


def _failed(text: str) -> StreamedResponse:
    return StreamedResponse({}, InternalError(text), True)
