"""infra/terraform without a cloud: every file parses (python-hcl2), variables and outputs
are documented and checked, the CloudWatch alarms watch exactly what zeroserve publishes, and
the cluster is configured the way the code needs (Knative flags for GPU pools, the monitoring
files provisioned).

checkov runs in ``.ci/run``, from a virtual environment of its own, not here. ``terraform
validate`` needs the providers, which come from a registry this machine cannot reach, so it
is not run here; the README's deploy steps run it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hcl2
import pytest
import yaml

from foundation.cloudwatch import (
    ACTIVATION_DURATION,
    ACTIVATION_FAILURES,
    METRIC_NAMES,
    NAMESPACE,
    REQUEST_LATENCY,
    REQUESTS,
    REQUESTS_5XX,
)

ROOT = Path(__file__).resolve().parents[2]
TERRAFORM = ROOT / "infra" / "terraform"
FILES = sorted(TERRAFORM.glob("*.tf"))

FREE_FORM_VARIABLES = {"tags", "images"}
"""Maps whose keys and values are the user's own: nothing to validate."""


@functools.cache
def _load(path: Path) -> dict[str, Any]:
    with path.open() as handle:
        document: dict[str, Any] = hcl2.load(handle)
    return document


def _text(value: Any) -> str:
    """An HCL string literal as python-hcl2 gives it (quotes kept), without its quotes."""
    assert isinstance(value, str), value
    if value.startswith('"') and value.endswith('"'):
        text: str = json.loads(value)
        return text
    return value


def _blocks(kind: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(type, name, body) of every ``kind`` block (resource, data) in every file."""
    for path in FILES:
        for entry in _load(path).get(kind, []):
            for type_, named in entry.items():
                for name, body in named.items():
                    yield _text(type_), _text(name), body


def _named(kind: str) -> dict[str, dict[str, Any]]:
    """name -> body of every ``kind`` block (variable, output)."""
    found: dict[str, dict[str, Any]] = {}
    for path in FILES:
        for entry in _load(path).get(kind, []):
            for name, body in entry.items():
                found[_text(name)] = body
    return found


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in FILES])
def test_every_file_parses(path: Path) -> None:
    assert _load(path)


def test_the_configuration_has_what_the_issue_asks_for() -> None:
    resources = {type_ for type_, _, _ in _blocks("resource")}
    assert {
        "aws_s3_bucket",
        "aws_s3_bucket_public_access_block",
        "aws_s3_bucket_versioning",
        "aws_s3_bucket_server_side_encryption_configuration",
        "aws_s3_bucket_policy",
        "aws_elasticache_replication_group",
        "aws_iam_role",
        "aws_cloudwatch_log_group",
        "aws_cloudwatch_metric_alarm",
        "helm_release",
        "kubectl_manifest",
    } <= resources
    modules = {_text(name) for path in FILES for m in _load(path).get("module", []) for name in m}
    assert modules == {"vpc", "eks", "lb_controller_irsa", "gpu_pod_requests"}
    charts = {
        _text(body["chart"]) for type_, _, body in _blocks("resource") if type_ == "helm_release"
    }
    assert charts == {
        "nvidia-device-plugin",
        "cluster-autoscaler",
        "knative-operator",
        "kube-prometheus-stack",
        "aws-load-balancer-controller",
    }


def test_every_variable_is_described_and_validated() -> None:
    variables = _named("variable")
    assert len(variables) > 20
    for name, body in variables.items():
        assert _text(body.get("description", "")).strip(), f"variable {name} has no description"
        if name in FREE_FORM_VARIABLES or body.get("type") == "bool":
            continue
        assert body.get("validation"), f"variable {name} has no validation"


def test_every_output_is_described() -> None:
    outputs = _named("output")
    assert outputs
    for name, body in outputs.items():
        assert _text(body.get("description", "")).strip(), f"output {name} has no description"


def _alarm_metrics(body: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(namespace, metric name) of every metric an alarm reads."""
    if "metric_name" in body:
        yield _text(body["namespace"]), _text(body["metric_name"])
    for query in body.get("metric_query", []):
        for metric in query.get("metric", []):
            yield _text(metric["namespace"]), _text(metric["metric_name"])


def test_alarms_watch_exactly_what_zeroserve_publishes() -> None:
    alarms = {
        name: body
        for type_, name, body in _blocks("resource")
        if type_ == "aws_cloudwatch_metric_alarm"
    }
    watched: dict[str, set[str]] = {}
    for name, body in alarms.items():
        pairs = set(_alarm_metrics(body))
        assert pairs, f"alarm {name} reads no metric"
        assert {namespace for namespace, _ in pairs} == {NAMESPACE}, name
        watched[name] = {metric for _, metric in pairs}
        assert watched[name] <= METRIC_NAMES, f"{name}: {watched[name] - METRIC_NAMES}"
        assert not body.get("dimensions"), f"{name}: zeroserve publishes no dimensions"
    assert watched == {
        "activation_failures": {ACTIVATION_FAILURES},
        "error_5xx_rate": {REQUESTS_5XX, REQUESTS},
        "p99_latency": {REQUEST_LATENCY},
        "cold_start_time": {ACTIVATION_DURATION},
    }
    assert _text(alarms["p99_latency"]["extended_statistic"]) == "p99"
    assert _text(alarms["p99_latency"]["unit"]) == "Milliseconds"
    assert _text(alarms["cold_start_time"]["unit"]) == "Seconds"


def test_metric_publishing_is_limited_to_zeroserves_namespace() -> None:
    [policy] = [
        body
        for type_, name, body in _blocks("data")
        if type_ == "aws_iam_policy_document" and name == "publish_metrics"
    ]
    [statement] = policy["statement"]
    assert statement["actions"] == ["cloudwatch:PutMetricData"] or [
        _text(a) for a in statement["actions"]
    ] == ["cloudwatch:PutMetricData"]
    [condition] = statement["condition"]
    assert _text(condition["variable"]) == "cloudwatch:namespace"
    assert [_text(v) for v in condition["values"]] == [NAMESPACE]


def test_no_cluster_role_can_write_the_model_bucket() -> None:
    documents = {
        name: body for type_, name, body in _blocks("data") if type_ == "aws_iam_policy_document"
    }
    runtime_actions = {
        _text(action) for s in documents["runtime"]["statement"] for action in s["actions"]
    }
    assert runtime_actions == {"s3:GetObject", "s3:ListBucket", "kms:Decrypt"}
    # The control plane reads models as the runtime does (registration checks), no more.
    [control_plane_read] = [
        body
        for type_, name, body in _blocks("resource")
        if type_ == "aws_iam_role_policy" and name == "control_plane_read_models"
    ]
    assert "data.aws_iam_policy_document.runtime.json" in _text(control_plane_read["policy"])
    for name in ("runtime", "publish_metrics", "cluster_autoscaler"):
        for statement in documents[name]["statement"]:
            for action in map(_text, statement["actions"]):
                assert not action.startswith("s3:Put") and not action.startswith("s3:Delete")
                assert "*" not in action.split(":")[1] or action.startswith("kms"), action


def test_knative_is_configured_for_gpu_pools() -> None:
    text = (TERRAFORM / "knative.tf").read_text()
    for flag in (
        '"kubernetes.podspec-nodeselector"            = "enabled"',
        '"kubernetes.podspec-tolerations"             = "enabled"',
        '"kubernetes.podspec-affinity"                = "enabled"',
        '"kubernetes.podspec-volumes-hostpath"        = "enabled"',
        '"kubernetes.podspec-persistent-volume-claim" = "enabled"',
        '"allow-zero-initial-scale" = "true"',
        '"max-revision-timeout-seconds" = tostring(var.max_revision_timeout_s)',
        '"progress-deadline" = "${var.progress_deadline_s}s"',
    ):
        assert flag in text, flag


def test_the_monitoring_files_terraform_provisions_exist() -> None:
    text = (TERRAFORM / "monitoring.tf").read_text()
    for relative in (
        "monitoring/grafana/zeroserve.json",
        "monitoring/prometheus/zeroserve-rules.yaml",
    ):
        assert f'"${{path.module}}/../../{relative}"' in text, relative
        assert (ROOT / relative).is_file(), relative
    assert 'grafana_dashboard = "1"' in text


def _deploy_objects() -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> object of every manifest in deploy/kubernetes."""
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and "kind" in document and "metadata" in document:
                objects[document["kind"], document["metadata"]["name"]] = document
    return objects


def test_what_terraform_patches_exists_in_deploy_kubernetes() -> None:
    """Terraform changes deploy/kubernetes only by name: those names must be there."""
    objects = _deploy_objects()
    if not objects:
        pytest.skip("deploy/kubernetes has no manifests yet")
    overlay = (TERRAFORM / "zeroserve.tf").read_text()
    for kind, name in (("ConfigMap", "zeroserve-config"), ("Secret", "zeroserve-secrets")):
        assert (kind, name) in objects, (kind, name)
        assert f'name      = "{name}"' in overlay, name
    assert ("Ingress", "zeroserve") in objects
    [service_accounts] = [
        body["default"] for name, body in _named("variable").items() if name == "service_accounts"
    ]
    for name in service_accounts.values():
        assert ("ServiceAccount", _text(name)) in objects, name
    # The Secret's keys, as the workloads read them.
    secret_keys = set(objects["Secret", "zeroserve-secrets"]["stringData"])
    assert secret_keys == {"ZEROSERVE_ADMIN_TOKEN", "ZEROSERVE_STATE_URL"}
    for key in secret_keys:
        assert f"{key} " in overlay, key
    # The GPU pool selects the label the GPU node group carries.
    pools = json.loads(objects["ConfigMap", "zeroserve-config"]["data"]["ZEROSERVE_KNATIVE_POOLS"])
    main = (TERRAFORM / "main.tf").read_text()
    for pool in pools.values():
        for key, value in pool["node_selector"].items():
            assert f'gpu_label = {{ key = "{key}", value = "{value}" }}' in main, (key, value)
