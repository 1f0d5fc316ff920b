"""``triton_python_backend_utils``' errors: ``TritonError`` with its codes, and
``TritonModelException``; :mod:`pb_utils` re-exports them under Triton's names."""

from __future__ import annotations

import enum
from typing import Final


class ErrorCode(enum.IntEnum):
    """TRITONSERVER_Error_Code, the numbers ``TritonError.code()`` returns."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError:
    """An error a response carries (not an exception: raise TritonModelException)."""

    UNKNOWN: Final = ErrorCode.UNKNOWN
    INTERNAL: Final = ErrorCode.INTERNAL
    NOT_FOUND: Final = ErrorCode.NOT_FOUND
    INVALID_ARG: Final = ErrorCode.INVALID_ARG
    UNAVAILABLE: Final = ErrorCode.UNAVAILABLE
    UNSUPPORTED: Final = ErrorCode.UNSUPPORTED
    ALREADY_EXISTS: Final = ErrorCode.ALREADY_EXISTS
    CANCELLED: Final = ErrorCode.CANCELLED

    def __init__(self, message: str, code: int = ErrorCode.INTERNAL) -> None:
        if message is None or code is None:
            raise TypeError("TritonError takes a message and a code, neither None")
        self._message = str(message)
        self._code = ErrorCode(code)

    def code(self) -> ErrorCode:
        return self._code

    def message(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code.name})"


class TritonModelException(Exception):
    """Raised by the backend's own checks; a model may raise it too."""
