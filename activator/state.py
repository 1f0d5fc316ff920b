"""What request handlers share: built in the app's lifespan, reached through the scope."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from activator.metrics import ActivatorMetrics
from activator.placements import ModelCatalog, PlacementView
from activator.proxy import Proxy
from activator.settings import ActivatorSettings


@dataclass
class Lifecycle:
    """Whether the activator is draining for shutdown (readiness fails first)."""

    is_stopping: bool = False


class ActivatorState(TypedDict):
    """The lifespan state every handler sees."""

    settings: ActivatorSettings
    catalog: ModelCatalog
    proxy: Proxy
    view: PlacementView
    lifecycle: Lifecycle
    metrics: ActivatorMetrics
