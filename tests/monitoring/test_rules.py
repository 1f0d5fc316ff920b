"""The Prometheus alert rules in monitoring/prometheus: checked and unit-tested by promtool
(Debian's ``prometheus`` package; CI installs it), and well formed for Alertmanager."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.monitoring.queries import (
    CLUSTER_METRICS,
    RULES,
    load_rules,
    metric_names,
    rule_queries,
)

PROMTOOL_TIMEOUT_S = 60


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (apt-get install prometheus); CI installs it")
    return path


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", RULES.name],
        cwd=RULES.parent,
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = subprocess.run(
        [_promtool(), "test", "rules", RULES.with_suffix(".test.yaml").name],
        cwd=RULES.parent,
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_severity_a_summary_and_a_description() -> None:
    rules = [rule for group in load_rules()["groups"] for rule in group["rules"]]
    assert len(rules) >= 6
    for rule in rules:
        assert rule["alert"].startswith("Zeroserve"), rule
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["annotations"]["description"], rule["alert"]


def test_every_expression_names_a_metric() -> None:
    for query in rule_queries(load_rules()):
        assert metric_names(query), query


def test_alerts_watch_what_hurts_not_gpu_memory_in_use() -> None:
    """vLLM preallocates most of its GPU, so GPU memory in use is no alarm; queued LLM
    requests (no KV-cache room) and OOM-killed runtime containers are. The cluster's own
    series the rules read are the ones kube-state-metrics exports."""
    queried = set().union(*(metric_names(query) for query in rule_queries(load_rules())))
    assert "nv_gpu_memory_used_bytes" not in queried
    assert {"vllm:num_requests_waiting", *CLUSTER_METRICS} <= queried
    assert {n for n in queried if n.startswith("kube_")} <= CLUSTER_METRICS
