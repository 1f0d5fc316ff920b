"""What request handlers share: built in the app's lifespan, reached through the scope."""

from __future__ import annotations

from typing import TypedDict

from activator.gate import Gate
from activator.metrics import ActivatorMetrics
from activator.placements import ModelCatalog, PlacementView
from activator.proxy import Proxy
from activator.settings import ActivatorSettings

# The one Lifecycle every server shares, named here for the activator's modules.
from foundation.serving import Lifecycle

__all__ = ["ActivatorState", "Lifecycle"]


class ActivatorState(TypedDict):
    """The lifespan state every handler sees."""

    settings: ActivatorSettings
    catalog: ModelCatalog
    proxy: Proxy
    view: PlacementView
    lifecycle: Lifecycle
    metrics: ActivatorMetrics
    gate: Gate
