"""The public front door: one endpoint for every registered model, awake or not.

Owns the request path in front of the workers: API keys and their quotas, checked before
anything else (``gate``, over the key cache ``keys`` and the counters ``quotas``; on HTTP
by the ``auth`` middleware), routing by model name (``routes``),
least-outstanding load balancing over ready replicas (``lb``), the per-model buffer that
holds requests while a model is activated (``buffer``), the streaming proxy (``proxy``),
the local view of placements and model names (``placements``), the watch that takes a
worker that stopped answering out of routing (``health`` decides, ``watch`` probes), and
the reports to the control plane: traffic, which feeds the autoscaler and the reaper, and
each cold start's first response, which closes its timeline (``traffic``), and the
request ids and access log of every request, HTTP or gRPC (``access_log``). It runs inside
``zeroserve up`` or alone (``zeroserve activator``), then talking to the control plane
only through the shared state store.
"""
