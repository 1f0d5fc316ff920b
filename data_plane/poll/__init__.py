"""Model control mode ``poll``: the repository folder is scanned every
``--repository-poll-secs`` and what changed is applied, as Triton's poll mode does.

`scan` reads the repository into one snapshot per model (its files' names, sizes and
modification times); `decide` is the pure decision: what to load and unload given the last
state and a new scan, and the state after the attempts, with the clock as an argument;
`loop` is the thin task that scans, applies and records. A new or changed model is loaded
(a reload builds the new versions while the old ones serve, and requests already taken
finish on the old ones), a model gone from the folder is unloaded, and a model whose load
failed keeps what served before (if anything) and is tried again when its files change or,
backing off, after a while.
"""

from __future__ import annotations

from data_plane.poll.decide import Plan, PollState, RetryPolicy, Tracked, after, decide
from data_plane.poll.loop import RepositoryPoller, open_poller
from data_plane.poll.scan import scan_models

__all__ = [
    "Plan",
    "PollState",
    "RepositoryPoller",
    "RetryPolicy",
    "Tracked",
    "after",
    "decide",
    "open_poller",
    "scan_models",
]
