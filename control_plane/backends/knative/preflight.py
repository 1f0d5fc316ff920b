"""The knative backend's start-up check: does Knative's release and configuration allow our
Services?

Reads the release of Knative Serving from its ``controller`` Deployment (``version``: older
than 1.21 ignores the ``min-scale`` the backend patches on Revisions) and the config maps
``requirements.requirements_of`` names (``get`` on these named objects in ``knative-serving``;
see deploy/kubernetes/rbac.yaml) and compares them; the comparisons themselves are pure and
live in ``version`` and ``requirements``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from control_plane.backends.knative.api import KubeApi
from control_plane.backends.knative.errors import KnativeConfigError, KubeApiError
from control_plane.backends.knative.requirements import check_config, describe, requirements_of
from control_plane.backends.knative.version import (
    CONTROLLER_DEPLOYMENT,
    serving_version,
    version_problem,
)

__all__ = ["check_knative_config"]

logger = logging.getLogger(__name__)


async def check_knative_config(
    api: KubeApi,
    services: Sequence[Mapping[str, Any]],
    *,
    namespace: str,
    mode: Literal["strict", "warn", "off"],
) -> None:
    """Check Knative's release and config maps in ``namespace`` against what ``services``
    need.

    ``strict`` raises ``KnativeConfigError`` naming every problem and its fix, ``warn`` logs
    it, ``off`` reads nothing. A config map or Deployment that cannot be read counts as a
    problem; a release that does not say its version (a build from source) is only logged.
    """
    if mode == "off":
        return
    requirements = requirements_of(services)
    config_maps: dict[str, dict[str, str]] = {}
    unreadable: list[str] = []
    too_old = await _check_version(api, namespace, unreadable)
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
    if not problems and not unreadable and too_old is None:
        logger.info("Knative configuration has what the runtime pools need")
        return
    message = describe(problems, namespace) if problems else "Knative configuration:"
    if too_old is not None:
        message += f"\n  - {too_old}"
    if unreadable:
        message += "\n" + "\n".join(f"  - {line}" for line in unreadable)
        message += (
            "\n  (the control plane needs 'get' on these config maps and Deployment; "
            "or set ZEROSERVE_KNATIVE_CONFIG_CHECK=off to skip this check)"
        )
    if mode == "strict":
        lines = [p.message() for p in problems] + unreadable
        if too_old is not None:
            lines.insert(0, too_old)
        raise KnativeConfigError(problems=lines, message=message)
    logger.warning("%s", message)


async def _check_version(api: KubeApi, namespace: str, unreadable: list[str]) -> str | None:
    """The problem with Knative Serving's release, if any; an unreadable Deployment is added
    to ``unreadable``."""
    try:
        deployment = await api.read_deployment(namespace, CONTROLLER_DEPLOYMENT)
    except KubeApiError as exc:
        unreadable.append(
            f"cannot read deployment {namespace}/{CONTROLLER_DEPLOYMENT} (for Knative "
            f"Serving's version): {exc.message}"
        )
        return None
    if deployment is None:
        unreadable.append(
            f"deployment {namespace}/{CONTROLLER_DEPLOYMENT} does not exist: is Knative "
            f"Serving installed in namespace {namespace}?"
        )
        return None
    version = serving_version(deployment)
    if version is None:
        logger.warning(
            "Knative Serving's controller in %s does not say its release (no version "
            "label): assuming 1.21 or later, which the backend needs",
            namespace,
        )
        return None
    logger.info("Knative Serving %d.%d", *version)
    return version_problem(version, namespace)
