"""The knative backend's settings: environment names, JSON pools, ranges."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from control_plane.backends.knative.settings import KnativeSettings, PoolTemplate, Toleration


def test_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ZEROSERVE_KNATIVE_NAMESPACE", "models")
    monkeypatch.setenv(
        "ZEROSERVE_KNATIVE_POOLS",
        '{"gpu-l4": {"image": "img:1", "gpus": 1, "node_selector": {"pool": "gpu"},'
        ' "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",'
        ' "effect": "NoSchedule"}]}}',
    )
    monkeypatch.setenv("ZEROSERVE_KNATIVE_EXTRA_ENV", '{"AWS_REGION": "eu-west-1"}')
    settings = KnativeSettings()
    assert settings.namespace == "models"
    template = settings.pools["gpu-l4"]
    assert template.gpus == 1 and template.node_selector == {"pool": "gpu"}
    assert template.tolerations == (
        Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
    )
    assert settings.extra_env == {"AWS_REGION": "eu-west-1"}


def test_defaults_lift_knative_limits():
    settings = KnativeSettings()
    assert settings.progress_deadline_s > 600
    assert settings.revision_timeout_s > 600
    assert settings.config_check == "strict"
    assert set(settings.pools) == {"default"}


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"container_port": 8012}, id="queue-proxy-port"),
        pytest.param({"grpc_port": 9091}, id="grpc-on-a-queue-proxy-port"),
        pytest.param({"grpc_port": 8080}, id="grpc-on-the-http-port"),
        pytest.param({"cache_volume": "pvc"}, id="pvc-without-claim"),
        pytest.param({"cache_dir": "relative"}, id="relative-cache"),
        pytest.param({"stable_window_s": 5}, id="window-below-knative-minimum"),
        pytest.param({"extra_env": {"BAD NAME": "x"}}, id="env-name"),
    ],
)
def test_bad_settings(overrides):
    with pytest.raises(ValidationError):
        KnativeSettings(**overrides)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"memory": "lots"}, id="memory"),
        pytest.param({"cpu": "2 cores"}, id="cpu"),
        pytest.param({"image": ""}, id="image"),
        pytest.param({"gpus": -1}, id="gpus"),
        pytest.param({"surprise": 1}, id="unknown-field"),
    ],
)
def test_bad_templates(fields):
    with pytest.raises(ValidationError):
        PoolTemplate(**fields)


def test_bad_tolerations():
    with pytest.raises(ValidationError):
        Toleration(key="a", operator="Exists", value="b")
    with pytest.raises(ValidationError):
        Toleration(key="a", effect="NoSchedule", toleration_seconds=5)
