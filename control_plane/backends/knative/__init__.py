"""The ``knative`` backend: runtime workers as the pods of one Knative Service per pool.

- ``settings``: what the pods look like (image, GPUs, node placement, cache volume) and how
  the backend talks to the API server (``ZEROSERVE_KNATIVE_*``).
- ``manifests``: pure builders of the Knative Service and of the patches the backend sends.
- ``requirements``: the Knative configuration a manifest needs, and the check of it.
- ``pods``: pure reading of pod documents into the backend's view of a worker.
- ``api``: the thin applier over the official ``kubernetes`` client (the only module that
  imports it).
- ``scaler``: a pool's size, as its Revision's ``min-scale`` (read-modify-write).
- ``preflight``: the start-up check of Knative's config maps.
- ``backend``: ``KnativeBackend``, the ``PodBackend`` that scales pools through the Revision's
  ``min-scale`` and finds workers among the pool's ready pods.
"""
