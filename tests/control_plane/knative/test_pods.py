"""Reading pod documents: readiness, restarts, termination, address and why a pod is stuck."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.backends.knative.pods import read_pod, read_pods


def pod(
    *,
    name: str = "zeroserve-default-abc-deployment-1",
    pool: str | None = "default",
    ready: bool = True,
    ip: str | None = "10.0.0.7",
    restarts: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    labels = {"serving.knative.dev/revision": "zeroserve-default-abc"}
    if pool is not None:
        labels["zeroserve.io/pool"] = pool
    doc: dict[str, Any] = {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": "gpu-node-1",
            "containers": [
                {
                    "name": "runtime",
                    "ports": [{"containerPort": 8080}],
                    "args": ["serve", "--http-port", "8080", "--grpc-port", "8001"],
                },
                {"name": "queue-proxy", "ports": [{"containerPort": 8012}]},
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "startTime": "2026-11-21T10:00:00Z",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {"name": "queue-proxy", "restartCount": 5},
                {"name": "runtime", "restartCount": restarts},
            ],
        },
    }
    for key, value in extra.items():
        section, _, field = key.partition("__")
        doc[section][field] = value
    return doc


def test_a_ready_pod():
    view = read_pod(pod(), default_port=1)
    assert view is not None
    assert (view.name, view.pool, view.port, view.url) == (
        "zeroserve-default-abc-deployment-1",
        "default",
        8080,
        "http://10.0.0.7:8080",
    )
    assert view.is_ready and not view.is_gone and view.problem is None
    assert view.worker_id == view.name
    assert view.grpc_address == "10.0.0.7:8001"


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["serve", "--http-port", "8080"], id="no-grpc-argument"),
        pytest.param(["serve", "--grpc-port", "0"], id="grpc-off"),
        pytest.param(["serve", "--grpc-port"], id="argument-without-value"),
        pytest.param(["serve", "--grpc-port", "x"], id="not-a-port"),
        pytest.param(["serve", "--grpc-port", "70000"], id="out-of-range"),
    ],
)
def test_a_runtime_without_a_grpc_port_has_no_grpc_address(args: list[str]):
    doc = pod()
    doc["spec"]["containers"][0]["args"] = args
    view = read_pod(doc, default_port=1)
    assert view is not None and (view.grpc_port, view.grpc_address) == (0, "")
    assert view.revision == "zeroserve-default-abc"
    assert view.node == "gpu-node-1"
    assert view.started_at == pytest.approx(1795255200.0)


def test_a_restarted_runtime_is_a_new_worker():
    """Only the runtime container counts: queue-proxy restarts lose no model."""
    view = read_pod(pod(restarts=2), default_port=1)
    assert view is not None and view.restarts == 2
    assert view.worker_id.endswith("-r2")


@pytest.mark.parametrize(
    ("doc", "is_gone"),
    [
        (pod(metadata__deletionTimestamp="2026-11-21T10:00:00Z"), True),
        (pod(status__phase="Failed"), True),
        (pod(status__phase="Succeeded"), True),
        (pod(ready=False), False),
    ],
)
def test_gone_or_not(doc, is_gone):
    view = read_pod(doc, default_port=1)
    assert view is not None and view.is_gone is is_gone


def test_why_a_pod_is_stuck():
    unschedulable = pod(ready=False, ip=None)
    unschedulable["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes: Insufficient nvidia.com/gpu",
        }
    ]
    view = read_pod(unschedulable, default_port=1)
    assert view is not None and view.problem is not None
    assert "Insufficient nvidia.com/gpu" in view.problem
    pulling = pod(ready=False)
    pulling["status"]["containerStatuses"][1]["state"] = {
        "waiting": {"reason": "ImagePullBackOff", "message": "pull access denied"}
    }
    view = read_pod(pulling, default_port=1)
    assert (
        view is not None
        and view.problem == "container runtime: ImagePullBackOff: pull access denied"
    )


def test_odd_documents():
    assert read_pod(pod(pool=None), default_port=1) is None
    bare = read_pod(
        {"metadata": {"name": "p", "labels": {"zeroserve.io/pool": "x"}}}, default_port=9
    )
    assert bare is not None
    assert (bare.port, bare.ip, bare.is_ready, bare.phase, bare.started_at) == (
        9,
        None,
        False,
        "Unknown",
        0.0,
    )
    ipv6 = read_pod(pod(ip="fd00::7"), default_port=1)
    assert ipv6 is not None and ipv6.url == "http://[fd00::7]:8080"
    assert ipv6.grpc_address == "[fd00::7]:8001"
    assert bare.grpc_address == ""
    assert [v.name for v in read_pods({"items": [pod(), pod(pool=None)]}, default_port=1)] == [
        "zeroserve-default-abc-deployment-1"
    ]
    assert read_pods({"items": None}, default_port=1) == []
