"""The knative backend's errors, under the control plane's tree (``control_plane.errors``).

ControlPlaneError
├── KnativeConfigError          Knative lacks what the pools need (feature flags …)
└── ControlPlaneUnavailableError
    └── KubeApiError            a Kubernetes API call failed or went unanswered
        └── KubeConflictError   409: the object changed since it was read
"""

from __future__ import annotations

from control_plane.errors import ControlPlaneError, ControlPlaneUnavailableError

__all__ = ["KnativeConfigError", "KubeApiError", "KubeConflictError"]


class KnativeConfigError(ControlPlaneError):
    """Knative Serving's configuration does not allow what the runtime pools need."""

    def __init__(self, *, problems: list[str], message: str) -> None:
        super().__init__(message)
        self.problems = problems


class KubeApiError(ControlPlaneUnavailableError):
    """``operation`` on the Kubernetes API failed; ``status`` 0 means no answer came."""

    retry_after_s = 5

    def __init__(self, *, operation: str, status: int, reason: str) -> None:
        answer = f"HTTP {status}" if status else "no answer"
        super().__init__(f"Kubernetes API: {operation}: {answer}: {reason}")
        self.operation = operation
        self.status = status
        self.reason = reason


class KubeConflictError(KubeApiError):
    """The object changed between our read and our write (HTTP 409); read it again."""
