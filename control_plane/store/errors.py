"""What a state store raises on purpose: the control plane's branch of the one error tree.

    ZeroserveError                          foundation.errors
    └── ControlPlaneError                   control_plane.errors
        ├── ConflictError
        │   └── StoreConflictError          a create of something that exists, or an update
        │                                   of something that does not (defined in
        │                                   ``store.base``, re-exported here)
        └── ControlPlaneUnavailableError
            └── StoreUnavailableError       the store could not be reached, or did not
                                            answer in time

Both are free of HTTP; the admin API maps them (409 and 503 with ``Retry-After``) in one place.
"""

from __future__ import annotations

from control_plane.errors import ControlPlaneUnavailableError
from control_plane.store.base import StoreConflictError

__all__ = ["StoreConflictError", "StoreUnavailableError"]


class StoreUnavailableError(ControlPlaneUnavailableError):
    """The store could not be reached, or did not answer within its timeout.

    Raised instead of hanging: every store call is bounded. A retry later may succeed, and
    whether the call took effect is unknown (a write may have landed before the answer was
    lost), so callers retry only what is idempotent.
    """

    def __init__(self, *, store: str, operation: str, reason: str) -> None:
        super().__init__(f"state store {store} unavailable during {operation}: {reason}")
        self.store = store
        """Where the store is, credentials removed, e.g. ``redis://10.0.0.5:6379/0``."""
        self.operation = operation
        """The store method that failed, e.g. ``add_placement``."""
        self.reason = reason
        """What went wrong, e.g. ``no answer within 2.0 s`` or the socket error."""
