"""The Knative configuration our Services need, and the pure check of a cluster's against it.

Knative rejects a Service that uses a feature-gated PodSpec field (nodeSelector, tolerations,
hostPath volumes …) unless ``config-features`` enables it, refuses ``initial-scale: 0`` unless
``config-autoscaler`` allows it, and caps ``timeoutSeconds`` by ``config-defaults``'
``max-revision-timeout-seconds``. Each would surface as an admission error on the first apply,
or worse, as a revision that silently grabs a GPU; ``check_config`` finds all of them at
start and ``describe`` says what to change (shared/research/knative-kserve.md §2.3).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AUTOSCALER_CONFIG",
    "DEFAULTS_CONFIG",
    "FEATURES_CONFIG",
    "Problem",
    "Requirement",
    "check_config",
    "describe",
    "requirements_of",
]

FEATURES_CONFIG = "config-features"
AUTOSCALER_CONFIG = "config-autoscaler"
DEFAULTS_CONFIG = "config-defaults"

# Knative's default when the key is absent (pkg/apis/config/defaults.go).
_DEFAULT_MAX_REVISION_TIMEOUT_S = 600
_ENABLED = frozenset({"enabled"})
# PodSpec fields pass the webhook when their flag is not "disabled"; volumes need "enabled"
# (pkg/apis/serving/fieldmask.go and k8s_validation.go).
_ENABLED_OR_ALLOWED = frozenset({"enabled", "allowed"})
_TRUE = frozenset({"true", "1", "t"})


@dataclass(frozen=True, slots=True)
class Requirement:
    """One key of one Knative config map that a manifest depends on."""

    config_map: str
    key: str
    accepted: frozenset[str]
    """Values (lowercase) that satisfy it; empty when ``at_least`` decides."""
    why: str
    default: str = "disabled"
    """Knative's value when the key is absent from the config map (pkg/apis/config/
    features.go, defaults.go and pkg/autoscaler/config/config.go)."""
    at_least: int | None = None
    """For numeric keys: the smallest value that satisfies it."""

    @property
    def wanted(self) -> str:
        """The value ``describe`` proposes."""
        if self.at_least is not None:
            return str(self.at_least)
        return "true" if self.accepted == _TRUE else "enabled"


@dataclass(frozen=True, slots=True)
class Problem:
    """A requirement the cluster's configuration does not meet."""

    requirement: Requirement
    found: str | None
    """The value in the config map; None when the key is absent (Knative's default applies)."""

    def message(self) -> str:
        r = self.requirement
        found = (
            f"'{self.found}'"
            if self.found is not None
            else f"unset (Knative's default '{r.default}')"
        )
        need = f"at least {r.at_least}" if r.at_least is not None else f"'{r.wanted}'"
        return f"{r.config_map}: {r.key} is {found}, needs {need} ({r.why})"


def requirements_of(services: Iterable[Mapping[str, Any]]) -> list[Requirement]:
    """What the Knative Services (from ``manifests.make_service``) need from the cluster."""
    needs: dict[tuple[str, str], Requirement] = {}

    def need(requirement: Requirement) -> None:
        key = (requirement.config_map, requirement.key)
        current = needs.get(key)
        if current is None or (requirement.at_least or 0) > (current.at_least or 0):
            needs[key] = requirement

    for service in services:
        template = service["spec"]["template"]
        spec = template["spec"]
        annotations = template.get("metadata", {}).get("annotations", {})
        for field, flag in (
            ("nodeSelector", "kubernetes.podspec-nodeselector"),
            ("tolerations", "kubernetes.podspec-tolerations"),
            ("runtimeClassName", "kubernetes.podspec-runtimeclassname"),
            ("affinity", "kubernetes.podspec-affinity"),
        ):
            if spec.get(field):
                need(Requirement(FEATURES_CONFIG, flag, _ENABLED_OR_ALLOWED, f"pods use {field}"))
        for volume in spec.get("volumes", []):
            for requirement in _volume_requirements(volume):
                need(requirement)
        if annotations.get("autoscaling.knative.dev/initial-scale") == "0":
            need(
                Requirement(
                    AUTOSCALER_CONFIG,
                    "allow-zero-initial-scale",
                    _TRUE,
                    "a new revision must not start a GPU pod before it is asked for",
                    default="false",
                )
            )
        if annotations.get("autoscaling.knative.dev/min-scale", "0") == "0":
            need(
                Requirement(
                    AUTOSCALER_CONFIG,
                    "enable-scale-to-zero",
                    _TRUE,
                    "idle pools must go to zero pods",
                    default="true",
                )
            )
        timeout = max(
            int(spec.get("timeoutSeconds", 0)), int(spec.get("responseStartTimeoutSeconds", 0))
        )
        if timeout > _DEFAULT_MAX_REVISION_TIMEOUT_S:
            need(
                Requirement(
                    DEFAULTS_CONFIG,
                    "max-revision-timeout-seconds",
                    frozenset(),
                    f"the pods' timeoutSeconds is {timeout}",
                    default=str(_DEFAULT_MAX_REVISION_TIMEOUT_S),
                    at_least=timeout,
                )
            )
    return sorted(needs.values(), key=lambda r: (r.config_map, r.key))


def _volume_requirements(volume: Mapping[str, Any]) -> list[Requirement]:
    name = volume.get("name", "?")
    if "hostPath" in volume:
        return [
            Requirement(
                FEATURES_CONFIG,
                "kubernetes.podspec-volumes-hostpath",
                _ENABLED,
                f"volume '{name}' is a hostPath (the node cache)",
            )
        ]
    if "persistentVolumeClaim" in volume:
        found = [
            Requirement(
                FEATURES_CONFIG,
                "kubernetes.podspec-persistent-volume-claim",
                _ENABLED,
                f"volume '{name}' is a PersistentVolumeClaim",
            )
        ]
        if not volume["persistentVolumeClaim"].get("readOnly", False):
            found.append(
                Requirement(
                    FEATURES_CONFIG,
                    "kubernetes.podspec-persistent-volume-write",
                    _ENABLED,
                    f"volume '{name}' is written to",
                )
            )
        return found
    if "emptyDir" in volume:
        return [
            Requirement(
                FEATURES_CONFIG,
                "kubernetes.podspec-volumes-emptydir",
                _ENABLED,
                f"volume '{name}' is an emptyDir",
                default="enabled",
            )
        ]
    return []


def check_config(
    requirements: Iterable[Requirement], config_maps: Mapping[str, Mapping[str, str]]
) -> list[Problem]:
    """The requirements ``config_maps`` (name -> data; absent maps count as empty) misses."""
    problems = []
    for requirement in requirements:
        data = config_maps.get(requirement.config_map, {})
        found = data.get(requirement.key)
        if not _is_met(requirement, found):
            problems.append(Problem(requirement, found))
    return problems


def _is_met(requirement: Requirement, found: str | None) -> bool:
    value = (found if found is not None else requirement.default).strip().lower()
    if requirement.at_least is not None:
        try:
            return int(value) >= requirement.at_least
        except ValueError:
            return False
    return value in requirement.accepted


def describe(problems: Iterable[Problem], knative_namespace: str) -> str:
    """A message naming every problem and the ``kubectl`` patches that fix them."""
    problems = list(problems)
    lines = ["Knative Serving is not configured as the zeroserve runtime pools need:"]
    lines += [f"  - {p.message()}" for p in problems]
    by_map: dict[str, dict[str, str]] = {}
    for p in problems:
        by_map.setdefault(p.requirement.config_map, {})[p.requirement.key] = p.requirement.wanted
    lines.append("Fix (or set them in the Knative install, e.g. Terraform):")
    for config_map, data in sorted(by_map.items()):
        patch = '{"data":{' + ",".join(f'"{k}":"{v}"' for k, v in sorted(data.items())) + "}}"
        lines.append(
            f"  kubectl -n {knative_namespace} patch configmap {config_map} "
            f"--type merge -p '{patch}'"
        )
    return "\n".join(lines)
