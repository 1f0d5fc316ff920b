"""What Knative configuration a manifest needs, and the check of a cluster's against it."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.backends.base import PoolSpec
from control_plane.backends.knative.manifests import make_service
from control_plane.backends.knative.requirements import (
    AUTOSCALER_CONFIG,
    DEFAULTS_CONFIG,
    FEATURES_CONFIG,
    Problem,
    check_config,
    describe,
    requirements_of,
)
from control_plane.backends.knative.settings import KnativeSettings, PoolTemplate, Toleration

GPU = PoolTemplate(
    gpus=1,
    node_selector={"zeroserve.io/node-pool": "gpu"},
    tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),),
)
GOOD = {
    FEATURES_CONFIG: {
        "kubernetes.podspec-nodeselector": "enabled",
        "kubernetes.podspec-tolerations": "Allowed",
        "kubernetes.podspec-volumes-hostpath": "Enabled",
    },
    AUTOSCALER_CONFIG: {"allow-zero-initial-scale": "true"},
    DEFAULTS_CONFIG: {"max-revision-timeout-seconds": "3600"},
}


def gpu_service(**settings: Any) -> dict[str, Any]:
    return make_service(
        PoolSpec(name="gpu", device="cuda"), GPU, KnativeSettings(**settings), allowed_storage=()
    )


def keys(problems: list[Problem]) -> list[tuple[str, str]]:
    return sorted((p.requirement.config_map, p.requirement.key) for p in problems)


def test_a_gpu_pool_needs_its_flags():
    needs = {(r.config_map, r.key) for r in requirements_of([gpu_service()])}
    assert needs == {
        (FEATURES_CONFIG, "kubernetes.podspec-nodeselector"),
        (FEATURES_CONFIG, "kubernetes.podspec-tolerations"),
        (FEATURES_CONFIG, "kubernetes.podspec-volumes-hostpath"),
        (FEATURES_CONFIG, "kubernetes.podspec-volumes-emptydir"),
        (AUTOSCALER_CONFIG, "allow-zero-initial-scale"),
        (AUTOSCALER_CONFIG, "enable-scale-to-zero"),
        (DEFAULTS_CONFIG, "max-revision-timeout-seconds"),
    }


def test_a_configured_cluster_passes():
    assert check_config(requirements_of([gpu_service()]), GOOD) == []


def test_a_default_knative_install_misses_four_things():
    """Knative's defaults: feature flags disabled, initial scale 1, 600 s timeout cap."""
    problems = check_config(requirements_of([gpu_service()]), {})
    assert keys(problems) == [
        (AUTOSCALER_CONFIG, "allow-zero-initial-scale"),
        (DEFAULTS_CONFIG, "max-revision-timeout-seconds"),
        (FEATURES_CONFIG, "kubernetes.podspec-nodeselector"),
        (FEATURES_CONFIG, "kubernetes.podspec-tolerations"),
        (FEATURES_CONFIG, "kubernetes.podspec-volumes-hostpath"),
    ]
    message = describe(problems, "knative-serving")
    assert "kubernetes.podspec-tolerations is unset (Knative's default 'disabled')" in message
    assert (
        "max-revision-timeout-seconds is unset (Knative's default '600'), needs at least 900"
        in (message)
    )
    assert (
        "kubectl -n knative-serving patch configmap config-autoscaler --type merge "
        """-p '{"data":{"allow-zero-initial-scale":"true"}}'"""
    ) in message


@pytest.mark.parametrize(
    ("config_map", "key", "value"),
    [
        pytest.param(
            FEATURES_CONFIG, "kubernetes.podspec-volumes-hostpath", "allowed", id="volume"
        ),
        pytest.param(FEATURES_CONFIG, "kubernetes.podspec-nodeselector", "disabled", id="flag"),
        pytest.param(AUTOSCALER_CONFIG, "allow-zero-initial-scale", "false", id="zero-initial"),
        pytest.param(AUTOSCALER_CONFIG, "enable-scale-to-zero", "false", id="scale-to-zero"),
        pytest.param(DEFAULTS_CONFIG, "max-revision-timeout-seconds", "600", id="timeout"),
        pytest.param(DEFAULTS_CONFIG, "max-revision-timeout-seconds", "lots", id="not-a-number"),
    ],
)
def test_each_wrong_value_is_one_problem(config_map, key, value):
    """Volumes need "enabled" (Knative's webhook refuses "allowed" for them)."""
    config = {name: dict(data) for name, data in GOOD.items()}
    config[config_map][key] = value
    problems = check_config(requirements_of([gpu_service()]), config)
    assert keys(problems) == [(config_map, key)]
    assert f"is '{value}'" in problems[0].message()


def test_a_plain_cpu_pool_with_short_timeouts_needs_little():
    service = make_service(
        PoolSpec(name="cpu"),
        PoolTemplate(),
        KnativeSettings(revision_timeout_s=300),
        allowed_storage=(),
    )
    problems = check_config(requirements_of([service]), {})
    assert keys(problems) == [
        (AUTOSCALER_CONFIG, "allow-zero-initial-scale"),
        (FEATURES_CONFIG, "kubernetes.podspec-volumes-hostpath"),
    ]


def test_a_pvc_cache_needs_claims_and_writes():
    service = make_service(
        PoolSpec(name="cpu"),
        PoolTemplate(),
        KnativeSettings(cache_volume="pvc", cache_claim="cache"),
        allowed_storage=(),
    )
    needs = {r.key for r in requirements_of([service])}
    assert {
        "kubernetes.podspec-persistent-volume-claim",
        "kubernetes.podspec-persistent-volume-write",
    } <= needs
    assert "kubernetes.podspec-volumes-hostpath" not in needs


def test_the_largest_timeout_of_several_pools_counts():
    services = [gpu_service(revision_timeout_s=700), gpu_service(revision_timeout_s=1200)]
    (timeout,) = [r for r in requirements_of(services) if r.at_least is not None]
    assert timeout.at_least == 1200
