"""``triton_python_backend_utils.ResponseIterator``: the responses of a decoupled BLS
call, as the model iterates them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtimes.python_backend.pb_response import InferenceResponse


class ResponseIterator:
    """The responses of a decoupled BLS call (``exec(decoupled=True)``), in order; the
    last one is final and may carry no outputs."""

    def __init__(
        self,
        next_response: Callable[[], InferenceResponse | None],
        cancel: Callable[[], None],
    ) -> None:
        self._next_response = next_response
        self._cancel = cancel
        self._is_finished = False

    def __iter__(self) -> Iterator[InferenceResponse]:
        return self

    def __next__(self) -> InferenceResponse:
        if self._is_finished:
            raise StopIteration
        response = self._next_response()
        if response is None or response.is_last:
            self._is_finished = True
        if response is None:
            raise StopIteration
        return response

    def cancel(self) -> None:
        """Ask the server to cancel the call; the responses still come to their end."""
        self._cancel()
