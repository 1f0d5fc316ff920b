"""Which Knative Serving release a cluster runs, read from what its release publishes.

The backend sets a pool's size by patching ``min-scale`` on the pool's Revision. Knative's
PodAutoscaler follows a Revision's annotations only from Serving 1.21 on (knative/serving
#16186, "Allow manual scaling of the Pod Autoscaler", first in 1.21.0); on older releases
the patch is accepted and ignored, every pool stays at zero pods and every activation times
out. So the preflight reads the release and refuses an older one.

Knative's release build stamps ``app.kubernetes.io/version: "<major>.<minor>.<patch>"`` on
every object of ``serving-core.yaml`` (hack/generate-yamls.sh turns the source's ``devel``
into the tag), among them the ``controller`` Deployment in ``knative-serving``, which is
what is read here (one named object in the namespace the config maps are read from). Before
1.4 the release label was ``serving.knative.dev/release: "v<version>"``; it is read too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "CONTROLLER_DEPLOYMENT",
    "MIN_SERVING_VERSION",
    "serving_version",
    "version_problem",
]

CONTROLLER_DEPLOYMENT = "controller"
"""Knative Serving's controller Deployment, the object whose labels name the release."""
MIN_SERVING_VERSION = (1, 21)
"""The first release whose PodAutoscaler takes ``min-scale`` from a patched Revision."""

_LABELS = ("app.kubernetes.io/version", "serving.knative.dev/release")
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+].*)?$")


def serving_version(deployment: Mapping[str, Any]) -> tuple[int, int] | None:
    """(major, minor) of the release that made ``deployment``; None when its labels do not
    say (a build from source is labelled ``devel``)."""
    labels = (deployment.get("metadata") or {}).get("labels") or {}
    for label in _LABELS:
        match = _VERSION.match(str(labels.get(label, "")).strip())
        if match:
            return int(match.group(1)), int(match.group(2))
    return None


def version_problem(version: tuple[int, int], namespace: str) -> str | None:
    """What is wrong with running on ``version``; None when it is recent enough."""
    if version >= MIN_SERVING_VERSION:
        return None
    wanted = ".".join(map(str, MIN_SERVING_VERSION))
    found = ".".join(map(str, version))
    return (
        f"Knative Serving {found} is installed in namespace {namespace}; zeroserve needs "
        f"{wanted} or later: it sizes each pool by patching min-scale on the pool's Revision, "
        f"which older releases' autoscaler ignores, so every pool would stay at zero pods and "
        f"every activation would time out. Upgrade Knative Serving to {wanted} or later "
        f"(infra/terraform: knative_serving_version)"
    )
