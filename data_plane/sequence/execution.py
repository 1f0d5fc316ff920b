"""One direct-strategy execution on the engine: a lane's rows (real requests and fillers)
merged into one batch, or handed over as separate requests, and each row's outcome.

The oldest strategy needs none of this: its lanes feed a dynamic :class:`Batcher`, which
merges and splits as for any model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from data_plane.batcher import Execute, ExecuteRequests
from data_plane.errors import InternalError, ZeroserveError
from runtimes.model_request import ModelRequest, RequestContext, RequestOutcome

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class BatchRow:
    """One row of a direct batch: its inputs (the client's and the state, one row each),
    what the model learns of the request, and the batch's control tensors (one row per
    batch row, shared by the rows: this row's is the one at its position)."""

    inputs: Mapping[str, np.ndarray]
    context: RequestContext
    controls: Mapping[str, np.ndarray] = field(default_factory=dict)


class Engine:
    """Runs direct batches on one model version's engine.

    Parameters:
        execute: runs a merged batch (``ModelRuntime.infer``).
        execute_requests: given, batches go to it as separate requests instead (Triton's
            Python backend: the filler rows arrive as requests too, READY false).
        batching: the model batches; rows are concatenated along dim 0. Without batching a
            lane has one slot, so a batch has one row and goes as it is.
    """

    def __init__(
        self,
        execute: Execute,
        execute_requests: ExecuteRequests | None,
        *,
        batching: bool,
    ) -> None:
        self._execute = execute
        self._execute_requests = execute_requests
        self._batching = batching

    @property
    def takes_requests(self) -> bool:
        """Rows go to the engine as separate requests (their shapes need not agree)."""
        return self._execute_requests is not None

    async def run(self, rows: Sequence[BatchRow]) -> list[RequestOutcome]:
        """Every row's outputs (its own rows of them) or its own error.

        Raises ZeroserveError when the whole execution failed (an engine's exception
        becomes InternalError, as in the dynamic batcher); cancellation passes through.
        """
        controls = rows[0].controls if rows else {}
        try:
            if self._execute_requests is not None:
                requests = [
                    ModelRequest(
                        {**row.inputs, **{k: v[i : i + 1] for k, v in controls.items()}},
                        row.context,
                    )
                    for i, row in enumerate(rows)
                ]
                outcomes = await self._execute_requests(requests)
                if len(outcomes) != len(rows):
                    raise InternalError(
                        f"engine returned {len(outcomes)} outcomes for {len(rows)} requests"
                    )
                return outcomes
            if len(rows) == 1:
                return [await self._execute({**rows[0].inputs, **controls})]
            merged = {
                name: np.concatenate([row.inputs[name] for row in rows]) for name in rows[0].inputs
            }
            merged.update(controls)
            outputs = await self._execute(merged)
            return _split(outputs, len(rows))
        except (ZeroserveError, asyncio.CancelledError):
            raise
        except Exception as exc:
            logger.error("engine failed on a sequence batch of %d rows", len(rows), exc_info=exc)
            error = InternalError(str(exc) or type(exc).__name__)
            raise error from exc


def _split(outputs: Mapping[str, np.ndarray], rows: int) -> list[RequestOutcome]:
    for name, array in outputs.items():
        if array.shape[:1] != (rows,):
            raise InternalError(
                f"engine returned output '{name}' with shape {list(array.shape)} for a batch "
                f"of {rows} rows"
            )
    return [{name: array[i : i + 1] for name, array in outputs.items()} for i in range(rows)]


def filler_inputs(example: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inputs for a filler row shaped and typed as ``example``'s (zeros, empty strings):
    Triton sends whatever memory it has there, the model must not read it (READY false)."""
    filler: dict[str, np.ndarray] = {}
    for name, array in example.items():
        if array.dtype == np.object_:
            filler[name] = np.full(array.shape, b"", dtype=object)
        else:
            filler[name] = np.zeros(array.shape, dtype=array.dtype)
    return filler
