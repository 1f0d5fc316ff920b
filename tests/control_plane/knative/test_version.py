"""Knative Serving's release, read at start: older than 1.21 is refused.

The release is read from the ``controller`` Deployment's labels as Knative's release build
stamps them; the backend tests run against ``fake_kube.FakeKube`` (no API server can run
here), which labels its controller the same way.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from control_plane.backends.knative.errors import KnativeConfigError
from control_plane.backends.knative.version import serving_version
from tests.control_plane.knative.fake_kube import FakeKube
from tests.control_plane.knative.test_backend import GOOD_CONFIG, running

pytestmark = pytest.mark.anyio


def controller(labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "controller", "labels": labels}}


@pytest.mark.parametrize(
    ("labels", "version"),
    [
        ({"app.kubernetes.io/version": "1.21.0"}, (1, 21)),
        ({"app.kubernetes.io/version": "1.20.3"}, (1, 20)),
        ({"app.kubernetes.io/version": "2.0.1-rc.1"}, (2, 0)),
        # Before 1.4 the release label was Knative's own.
        ({"serving.knative.dev/release": "v1.3.2"}, (1, 3)),
        ({"app.kubernetes.io/version": "devel"}, None),
        ({}, None),
    ],
)
def test_the_release_is_read_from_the_labels(labels: dict[str, str], version: Any):
    assert serving_version(controller(labels)) == version


@pytest.mark.parametrize(
    ("version", "label"),
    [("1.20.3", "app.kubernetes.io/version"), ("v1.3.2", "serving.knative.dev/release")],
)
async def test_an_older_knative_is_refused_before_anything_is_applied(version: str, label: str):
    with FakeKube(config_maps=dict(GOOD_CONFIG), knative_version=None) as kube:
        kube.set_knative_version(version, label=label)
        with pytest.raises(KnativeConfigError) as caught:
            async with running(kube):
                pass
        found = ".".join(version.lstrip("v").split(".")[:2])
        assert f"Knative Serving {found} is installed" in caught.value.message
        assert "needs 1.21 or later" in caught.value.message
        assert kube.calls("PATCH", "/services/") == []


async def test_no_controller_is_refused_and_an_unlabelled_one_only_warned(
    caplog: pytest.LogCaptureFixture,
):
    with FakeKube(config_maps=dict(GOOD_CONFIG), knative_version=None) as kube:
        with pytest.raises(KnativeConfigError, match="deployment knative-serving/controller"):
            async with running(kube):
                pass
        kube.set_knative_version("devel")
        with caplog.at_level(logging.WARNING):
            async with running(kube):
                pass
        assert "does not say its release" in caplog.text
        assert len(kube.services) == 1
