"""Ensembles (``platform: "ensemble"``): models made of other models' steps.

Owns what a server does with an ensemble beyond reading its config (the config's own
checks live in :mod:`foundation.ensemble_config`): planning its load (`plan`), loading
its composing models first and checking it against them (`loader`, `binding`), keeping
it in and out of service with the models it uses (`dependencies`), and running each
request through its steps as a graph, every step an ordinary infer request on its
composing model (`scheduler`, with `step`); an ensemble with a decoupled step is
decoupled itself, and each response of that step runs the steps after it again and goes
out as a response of the ensemble (`streaming`). An ensemble version has no engine;
`runtime` stands in for one.
"""

from __future__ import annotations

from data_plane.ensemble.loader import EnsembleLoader
from data_plane.ensemble.plan import EnsemblePlan, plan_ensemble
from data_plane.ensemble.scheduler import Ensemble

__all__ = ["Ensemble", "EnsembleLoader", "EnsemblePlan", "plan_ensemble"]
