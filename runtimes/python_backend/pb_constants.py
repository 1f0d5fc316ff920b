"""``triton_python_backend_utils``' TRITONSERVER_* numbers (request flags, response
flags, release flags, memory types), as Triton's Python backend defines them."""

from __future__ import annotations

from typing import Final

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START: Final = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END: Final = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL: Final = 1
TRITONSERVER_REQUEST_RELEASE_ALL: Final = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: Final = 2
TRITONSERVER_MEMORY_GPU: Final = 0
TRITONSERVER_MEMORY_CPU: Final = 1
