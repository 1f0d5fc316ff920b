"""The control plane: what is registered, where it runs, and when it comes and goes.

Owns the registry and the admin API (``admin``, ``api``), the API keys callers send to
the activators (``keys``: made, listed, revoked), the shared state behind one
interface with an in-memory and a Redis implementation (``store``, ``records``), putting
replicas on workers and taking them off (``placement``), cold starts and their timelines
(``activation``), the KPA-style autoscaler (``autoscaler``), the idle path to zero
(``reaper``), the worker processes themselves (``backends``, ``worker_client``), and the
lease that lets one replica act while the others serve the admin API (``lease``).
``platform`` composes them: with the activator in one process for ``zeroserve up``, or
alone for ``zeroserve control-plane`` in a cluster, where activators reach it only through
the Redis store.
"""
