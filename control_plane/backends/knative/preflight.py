"""The knative backend's start-up check: does Knative's configuration allow our Services?

Reads the config maps ``requirements.requirements_of`` names (``get`` on three named maps
in ``knative-serving``; see deploy/kubernetes/rbac.yaml) and compares them; the comparison
itself is pure and lives in ``requirements``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from control_plane.backends.knative.api import KubeApi
from control_plane.backends.knative.errors import KnativeConfigError, KubeApiError
from control_plane.backends.knative.requirements import check_config, describe, requirements_of

__all__ = ["check_knative_config"]

logger = logging.getLogger(__name__)


async def check_knative_config(
    api: KubeApi,
    services: Sequence[Mapping[str, Any]],
    *,
    namespace: str,
    mode: Literal["strict", "warn", "off"],
) -> None:
    """Check Knative's config maps in ``namespace`` against what ``services`` need.

    ``strict`` raises ``KnativeConfigError`` naming every problem and its fix, ``warn`` logs
    it, ``off`` reads nothing. A config map that cannot be read counts as a problem.
    """
    if mode == "off":
        return
    requirements = requirements_of(services)
    config_maps: dict[str, dict[str, str]] = {}
    unreadable: list[str] = []
    for name in sorted({r.config_map for r in requirements}):
        try:
            data = await api.read_config_map(namespace, name)
        except KubeApiError as exc:
            unreadable.append(f"cannot read configmap {namespace}/{name}: {exc.message}")
            continue
        if data is None:
            unreadable.append(
                f"configmap {namespace}/{name} does not exist: is Knative Serving installed "
                f"in namespace {namespace}?"
            )
            continue
        config_maps[name] = data
    checked = [r for r in requirements if r.config_map in config_maps]
    problems = check_config(checked, config_maps)
    if not problems and not unreadable:
        logger.info("Knative configuration has what the runtime pools need")
        return
    message = describe(problems, namespace) if problems else "Knative configuration:"
    if unreadable:
        message += "\n" + "\n".join(f"  - {line}" for line in unreadable)
        message += (
            "\n  (the control plane needs 'get' on these config maps; "
            "or set ZEROSERVE_KNATIVE_CONFIG_CHECK=off to skip this check)"
        )
    if mode == "strict":
        lines = [p.message() for p in problems] + unreadable
        raise KnativeConfigError(problems=lines, message=message)
    logger.warning("%s", message)
