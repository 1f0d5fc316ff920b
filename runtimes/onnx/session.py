"""A loaded ``InferenceSession`` with the tensors it serves and the translation they need.

:meth:`Session.create` checks the model configuration against the model once, at load;
:meth:`Session.run` then checks each batch's input names, converts the values ONNX Runtime
and the server disagree on (:mod:`runtimes.onnx.dtypes`) and maps ORT's errors onto the
server's kinds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnxruntime as ort

from foundation import datatypes
from foundation.proto import model_config_pb2 as mc
from foundation.sequence_config import sequence_inputs, sequence_outputs
from runtimes.base import instance_count
from runtimes.errors import InternalError, InvalidArgumentError, ModelLoadError
from runtimes.onnx.dtypes import ORT_TYPES, bf16_ortvalue_to_float32, from_engine, to_engine
from runtimes.onnx.threads import is_latency_bound, runs_on_event_loop


@dataclass(frozen=True)
class Tensor:
    """A tensor the session serves."""

    name: str
    datatype: str
    """Protocol datatype (``FP32``)."""


@dataclass
class _Load:
    """Which session the last batch ran on (see :func:`is_latency_bound`)."""

    is_latency_bound: bool = True
    """An idle model's first batches are small: it starts latency-bound."""


@dataclass(frozen=True)
class Session:
    """An ``InferenceSession`` with the request/response translation it needs.

    Thread-safety: :meth:`run` may be called from several threads at once, as
    ``InferenceSession.run`` may.
    """

    session: ort.InferenceSession
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    providers: tuple[str, ...]
    has_bf16: bool
    max_batch_size: int = 0
    instances: int = 1
    """How many batches may run at once (the configuration's instance count)."""
    latency_session: ort.InferenceSession | None = None
    """The same model on a wide, spinning pool, run while batches are small
    (:mod:`runtimes.onnx.threads`); None: ``session`` runs every batch."""
    _load: _Load = field(default_factory=_Load, compare=False, repr=False)

    @classmethod
    def create(
        cls,
        session: ort.InferenceSession,
        config: mc.ModelConfig,
        providers: Sequence[str],
        load_error: Callable[[str], ModelLoadError],
    ) -> Session:
        """Check ``config`` against the model and keep the tensors it will serve."""
        model_inputs = {i.name: i.type for i in session.get_inputs()}
        model_outputs = {o.name: o.type for o in session.get_outputs()}
        try:
            # A sequence model's control and state tensors are the model's own too: the
            # sequence batcher feeds the inputs and keeps the state outputs.
            configured_inputs = [*config.input, *sequence_inputs(config)]
            configured_outputs = [*config.output, *sequence_outputs(config)]
            inputs = _select("input", configured_inputs, model_inputs, require_all=True)
            outputs = _select("output", configured_outputs, model_outputs, require_all=False)
        except ValueError as exc:
            raise load_error(str(exc)) from exc
        tensors = inputs + outputs
        has_bf16 = any(t.datatype == "BF16" for t in tensors)
        if has_bf16 and any(t.datatype == "BYTES" for t in tensors):
            # BF16 needs I/O binding (numpy has no bfloat16), which ORT refuses for strings.
            raise load_error("models mixing BF16 and BYTES tensors are not supported")
        return cls(
            session,
            inputs,
            outputs,
            tuple(providers),
            has_bf16,
            config.max_batch_size,
            instance_count(config),
        )

    def with_latency_session(self, session: ort.InferenceSession) -> Session:
        """This session, running small batches on ``session`` (the same model)."""
        return replace(self, latency_session=session, _load=_Load())

    def runs_inline(self, batch: Mapping[str, np.ndarray]) -> bool:
        """Whether ``batch`` runs on the awaiting thread (:func:`runs_on_event_loop`)."""
        return runs_on_event_loop(
            rows=_rows(batch),
            has_latency_session=self.latency_session is not None,
            instances=self.instances,
        )

    def session_for(self, rows: int) -> ort.InferenceSession:
        """The session a batch of ``rows`` runs on; updates which one the next batch's
        choice starts from."""
        if self.latency_session is None:
            return self.session
        # Executions may overlap with several instances; the flag is one bool, and a
        # stale read only picks the other session for one batch.
        wide = is_latency_bound(
            was=self._load.is_latency_bound, rows=rows, max_batch_size=self.max_batch_size
        )
        self._load.is_latency_bound = wide
        return self.latency_session if wide else self.session

    def run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch on the calling thread (an executor worker)."""
        unknown = batch.keys() - {t.name for t in self.inputs}
        if unknown:
            raise InvalidArgumentError(f"unexpected inference input {sorted(unknown)[0]!r}")
        feeds: dict[str, Any] = {}
        for tensor in self.inputs:
            if tensor.name not in batch:
                raise InvalidArgumentError(f"expected inference input {tensor.name!r}")
            feeds[tensor.name] = to_engine(tensor.name, tensor.datatype, batch[tensor.name])
        names = [t.name for t in self.outputs]
        session = self.session_for(_rows(batch))
        try:
            if self.has_bf16:
                values = self._run_bound(session, feeds)
            else:
                values = session.run(names, feeds)
        except Exception as exc:
            if isinstance(exc, ort.capi.onnxruntime_pybind11_state.InvalidArgument):
                raise InvalidArgumentError(str(exc)) from exc
            raise InternalError(f"ONNX Runtime failed: {exc}") from exc
        return {
            t.name: from_engine(t.datatype, v) for t, v in zip(self.outputs, values, strict=True)
        }

    def _run_bound(
        self, session: ort.InferenceSession, feeds: Mapping[str, Any]
    ) -> list[np.ndarray]:
        # Only I/O binding lets bfloat16 cross the Python boundary; outputs bound to "cpu"
        # come back as host OrtValues whose bytes we can copy.
        binding = session.io_binding()
        for name, value in feeds.items():
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        for tensor in self.outputs:
            binding.bind_output(tensor.name, "cpu")
        session.run_with_iobinding(binding)
        results: list[np.ndarray] = []
        for tensor, value in zip(self.outputs, binding.get_outputs(), strict=True):
            if tensor.datatype == "BF16":
                results.append(bf16_ortvalue_to_float32(value))
            else:
                results.append(value.numpy())
        return results


def _rows(batch: Mapping[str, np.ndarray]) -> int:
    """A batching model's batch rows: dim 0 of its inputs."""
    for array in batch.values():
        return int(array.shape[0]) if array.ndim else 1
    return 1


def _select(
    kind: str,
    entries: Sequence[mc.ModelInput] | Sequence[mc.ModelOutput],
    model: Mapping[str, str],
    *,
    require_all: bool,
) -> tuple[Tensor, ...]:
    """The tensors to serve: the config's (checked against the model) or all the model's.

    ``model`` maps the model's tensor names to ORT type strings. Raises ``ValueError`` with
    the reason when the config names a tensor the model lacks (or, with ``require_all``,
    lacks one the model has), or the types disagree or cannot be served.
    """
    names = [e.name for e in entries] or list(model)
    for name in names:
        if name not in model:
            raise ValueError(
                f"configuration {kind} {name!r} is not a model {kind}; model {kind}s: "
                f"{sorted(model)}"
            )
    if require_all and (missing := sorted(set(model) - set(names))):
        raise ValueError(f"model {kind} {missing[0]!r} is missing from the configuration")
    configured = {e.name: e.data_type for e in entries}
    tensors: list[Tensor] = []
    for name in names:
        datatype = ORT_TYPES.get(model[name])
        if datatype is None:
            raise ValueError(f"model {kind} {name!r} has unsupported type {model[name]}")
        declared = configured.get(name, mc.TYPE_INVALID)
        if declared != mc.TYPE_INVALID and datatypes.protocol_from_config(declared) != datatype:
            raise ValueError(
                f"configuration {kind} {name!r} is "
                f"{mc.DataType.Name(declared)} but the model has {model[name]}"
            )
        tensors.append(Tensor(name, datatype))
    return tuple(tensors)
