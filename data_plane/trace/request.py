"""A request being traced: made when the request is sampled, finished when it is answered.

The inference path calls :meth:`RequestTrace.finish` with the times it and the batcher read
(``REQUEST_START`` when the decoded request reaches inference, ``QUEUE_START`` when the
batcher queued it, the four compute times of the execution it joined, ``REQUEST_END`` when
its outputs were picked), :meth:`RequestTrace.cached` without the compute times when the
response cache answered it, or :meth:`RequestTrace.fail` with only the first and the last.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from data_plane.batcher import BatchedResult
from data_plane.trace.record import (
    COMPUTE_END,
    COMPUTE_INPUT_END,
    COMPUTE_OUTPUT_START,
    COMPUTE_START,
    QUEUE_START,
    REQUEST_END,
    REQUEST_START,
    TENSOR_BACKEND_OUTPUT,
    TENSOR_QUEUE_INPUT,
    TracedTensor,
    TraceRecord,
)
from data_plane.trace.setting import TraceSetting
from data_plane.trace.values import TraceLevel


class TypedTensor(Protocol):
    """What a trace needs of a model's tensor."""

    @property
    def datatype(self) -> str: ...


class TracedModel(Protocol):
    """What a trace needs of the model version a request ran on."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> int: ...

    @property
    def inputs(self) -> Mapping[str, TypedTensor]: ...

    @property
    def outputs(self) -> Mapping[str, TypedTensor]: ...


class RequestTrace:
    """One sampled request, written under the setting that sampled it."""

    __slots__ = ("id", "setting")

    def __init__(self, trace_id: int, setting: TraceSetting) -> None:
        self.id = trace_id
        self.setting = setting

    def finish(
        self,
        model: TracedModel,
        request_id: str | None,
        *,
        request_start_ns: int,
        request_end_ns: int,
        result: BatchedResult,
        inputs: Mapping[str, np.ndarray],
    ) -> None:
        """The request was answered with ``result``, which ran on ``inputs``."""
        level = self.setting.level
        timestamps: tuple[tuple[str, int], ...] = ()
        if level & TraceLevel.TIMESTAMPS:
            compute_start = result.compute_start_ns
            timestamps = (
                (REQUEST_START, request_start_ns),
                (QUEUE_START, compute_start - result.queue_ns),
                (COMPUTE_START, result.exec_start_ns),
                (COMPUTE_INPUT_END, compute_start),
                (COMPUTE_OUTPUT_START, compute_start + result.compute_ns),
                (COMPUTE_END, result.exec_end_ns),
                (REQUEST_END, request_end_ns),
            )
        tensors: tuple[TracedTensor, ...] = ()
        if level & TraceLevel.TENSORS:
            tensors = (
                *_tensors(TENSOR_QUEUE_INPUT, inputs, model.inputs),
                *_tensors(TENSOR_BACKEND_OUTPUT, result.outputs, model.outputs),
            )
        self._collect(model, request_id, timestamps, tensors)

    def cached(
        self,
        model: TracedModel,
        request_id: str | None,
        *,
        request_start_ns: int,
        queue_start_ns: int,
        request_end_ns: int,
    ) -> None:
        """The request was answered from the response cache: queued, never executed."""
        timestamps: tuple[tuple[str, int], ...] = ()
        if self.setting.level & TraceLevel.TIMESTAMPS:
            timestamps = (
                (REQUEST_START, request_start_ns),
                (QUEUE_START, queue_start_ns),
                (REQUEST_END, request_end_ns),
            )
        self._collect(model, request_id, timestamps, ())

    def fail(
        self,
        model: TracedModel,
        request_id: str | None,
        *,
        request_start_ns: int,
        request_end_ns: int,
    ) -> None:
        """The request failed; its trace holds when it started and ended."""
        timestamps: tuple[tuple[str, int], ...] = ()
        if self.setting.level & TraceLevel.TIMESTAMPS:
            timestamps = ((REQUEST_START, request_start_ns), (REQUEST_END, request_end_ns))
        self._collect(model, request_id, timestamps, ())

    def _collect(
        self,
        model: TracedModel,
        request_id: str | None,
        timestamps: tuple[tuple[str, int], ...],
        tensors: tuple[TracedTensor, ...],
    ) -> None:
        self.setting.collect(
            TraceRecord(self.id, model.name, model.version, request_id, timestamps, tensors)
        )


def _tensors(
    activity: str, arrays: Mapping[str, np.ndarray], specs: Mapping[str, TypedTensor]
) -> list[TracedTensor]:
    traced = []
    for name, data in arrays.items():
        spec = specs.get(name)
        if spec is not None:
            traced.append(TracedTensor(activity, name, spec.datatype, data))
    return traced
