"""The knative backend modules' public surface is what their ``__all__`` says (STYLE C23)."""

from __future__ import annotations

import importlib

import pytest

EXPORTS = {
    "control_plane.backends.knative.api": {"FIELD_MANAGER", "KubeApi", "create_api_client"},
    "control_plane.backends.knative.backend": {"KnativeBackend", "create_knative_backend"},
    "control_plane.backends.knative.errors": {
        "KnativeConfigError",
        "KubeApiError",
        "KubeConflictError",
    },
    "control_plane.backends.knative.manifests": {
        "API_VERSION",
        "CONTAINER_NAME",
        "DELETION_COST_ANNOTATION",
        "GROUP",
        "MIN_SCALE_ANNOTATION",
        "POOL_LABEL",
        "REPOSITORY_DIR",
        "RUNTIME_UID",
        "SAFE_TO_EVICT_ANNOTATION",
        "SHM_DIR",
        "VERSION",
        "deletion_cost_patch",
        "make_service",
        "min_scale_of",
        "min_scale_patch",
        "pin_revisions",
        "pool_selector",
        "revision_name",
        "service_name",
    },
    "control_plane.backends.knative.pods": {"PodView", "read_pod", "read_pods"},
    "control_plane.backends.knative.preflight": {"check_knative_config"},
    "control_plane.backends.knative.rollover": {"Rollover"},
    "control_plane.backends.knative.scaler": {"RevisionScaler"},
    "control_plane.backends.knative.requirements": {
        "AUTOSCALER_CONFIG",
        "DEFAULTS_CONFIG",
        "FEATURES_CONFIG",
        "Problem",
        "Requirement",
        "check_config",
        "describe",
        "requirements_of",
    },
    "control_plane.backends.knative.settings": {"KnativeSettings", "PoolTemplate", "Toleration"},
    "control_plane.backends.knative.version": {
        "CONTROLLER_DEPLOYMENT",
        "MIN_SERVING_VERSION",
        "serving_version",
        "version_problem",
    },
}


@pytest.mark.parametrize("module", sorted(EXPORTS))
def test_all(module: str):
    imported = importlib.import_module(module)
    assert set(imported.__all__) == EXPORTS[module]
    for name in imported.__all__:
        assert hasattr(imported, name), name


def test_the_pure_modules_do_not_need_the_kubernetes_client():
    """Settings, manifests, requirements and pods load where ``kubernetes`` is absent."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['kubernetes'] = None\n"
        "import control_plane.backends.knative.settings, control_plane.backends.knative.pods\n"
        "import control_plane.backends.knative.requirements, zeroserve.platform\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
