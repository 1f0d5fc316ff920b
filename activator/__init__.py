"""The public front door: one endpoint for every registered model, awake or not.

Owns the request path in front of the workers: routing by model name, least-outstanding
load balancing over ready replicas (``lb``), the per-model buffer that holds requests
while a model is activated (``buffer``), the streaming proxy (``proxy``), the local view
of placements and model names (``placements``), and the traffic reports that feed the
autoscaler and the reaper (``traffic``).
"""
