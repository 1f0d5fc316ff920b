"""What the monitoring files query, and what a ``/metrics`` page exports, as metric names.

PromQL is parsed with ``promql_parser`` (a binding of the Rust crate Greptime maintains);
Grafana's template variables are replaced first, since they are not PromQL.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "monitoring" / "grafana" / "zeroserve.json"
RULES = ROOT / "monitoring" / "prometheus" / "zeroserve-rules.yaml"

CLUSTER_METRICS = frozenset(
    {"kube_pod_container_status_restarts_total", "kube_pod_container_status_last_terminated_reason"}
)
"""Series of the cluster's kube-state-metrics (kube-prometheus-stack installs it; its chart's
kubeStateMetrics.enabled defaults to true), not of zeroserve: the rules use them to see what
Kubernetes does to the runtime pods (OOM kills)."""

_GRAFANA_RANGES = re.compile(r"\$\{?(__rate_interval|__interval|__range)\b\}?")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)\s*$")
_TYPE_LINE = re.compile(r"^# TYPE (?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*) (?P<kind>\w+)\s*$")
_SAMPLE_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]")


def load_dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def load_rules() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return document


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """The PromQL of every panel target and of every query variable."""
    queries = [
        target["expr"]
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = _LABEL_VALUES.match(text)
        if match is None:
            queries.append(text)
        elif match["selector"]:
            queries.append(match["selector"])
    return queries


def rule_queries(rules: dict[str, Any]) -> list[str]:
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def metric_names(query: str) -> set[str]:
    """The metric names ``query`` selects (Grafana's variables substituted)."""
    expr = promql_parser.parse(_GRAFANA_RANGES.sub("5m", query))
    names: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for matcher in node.matchers.matchers:
                if matcher.name == "__name__":
                    names.add(matcher.value)

    promql_parser.walk(expr, visit)
    return names


def exported_names(exposition: str) -> set[str]:
    """Names a Prometheus text page exports: every sample's, and those its ``# TYPE`` lines
    declare (a labelled metric nobody has touched yet is declared but has no samples)."""
    names: set[str] = set()
    for line in exposition.splitlines():
        declared = _TYPE_LINE.match(line)
        if declared is not None:
            name, kind = declared["name"], declared["kind"]
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            elif kind == "summary":
                names |= {name, f"{name}_sum", f"{name}_count"}
            else:
                names.add(name)
            continue
        sample = _SAMPLE_LINE.match(line)
        if sample is not None:
            names.add(sample["name"])
    return names
