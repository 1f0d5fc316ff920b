"""Which pool a model's replicas go to: a pure function of its record and the pools.

A pool of ``extra_pools`` takes the models of the backends it names (an LLM engine's image
is not the ONNX Runtime one); every other model goes to the default pool. Among the pools
that take a model's backend, one of the model's device comes first, else the first of them:
a ``cuda`` pool runs ``cpu`` models too, and a ``cpu`` pool refuses a ``cuda`` model with
its name in the reason, which says more than a load failing in an image without the
model's backend.
"""

from __future__ import annotations

from collections.abc import Sequence

from control_plane.settings import PoolSettings
from foundation.records import ModelRecord

__all__ = ["model_backend", "pool_for"]


def model_backend(model: ModelRecord) -> str:
    """The backend ``model`` was registered with: its own field, else its config's (what
    the admin API reads too); empty when neither says (a ``config.pbtxt`` in its storage)."""
    if model.backend:
        return model.backend
    named = (model.config or {}).get("backend")
    return named if isinstance(named, str) else ""


def pool_for(backend: str, device: str, pools: Sequence[PoolSettings], *, default: str) -> str:
    """The name of the pool a model of ``backend`` on ``device`` goes to."""
    serving = [pool for pool in pools if backend and backend in pool.backends]
    if not serving:
        return default
    same_device = [pool for pool in serving if pool.device == device]
    return (same_device or serving)[0].name
