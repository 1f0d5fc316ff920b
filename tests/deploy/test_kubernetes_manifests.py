"""deploy/kubernetes: every manifest validates against Kubernetes' schemas, and the pieces fit.

Built-in kinds are validated with kubernetes-validate (strict: unknown fields fail).
ServiceMonitor and PodMonitor are Prometheus Operator CRDs, which kubernetes-validate does
not know, so they are checked structurally here instead (required fields, and that their
selectors and ports name real Services and pods). No cluster runs here: nothing is applied.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.routing import Route

from activator.routes import routes as activator_routes
from activator.settings import ActivatorSettings
from control_plane.backends.base import PoolSpec
from control_plane.backends.knative.manifests import make_service
from control_plane.backends.knative.settings import KnativeSettings
from control_plane.backends.knative.version import CONTROLLER_DEPLOYMENT
from control_plane.settings import ControlPlaneSettings
from tests.control_plane.knative.schemas import (
    knative_service_errors,
    kubernetes_errors,
    metadata_errors,
    pod_template_errors,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
CRD_KINDS = {"ServiceMonitor", "PodMonitor"}
NAMESPACE = "zeroserve"


def load() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                doc["__file"] = path.name
                docs.append(doc)
    return docs


DOCS = load()


def plain(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "__file"}


def named(kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in DOCS if d["kind"] == kind and name in (None, d["metadata"]["name"])]


def one(kind: str, name: str) -> dict[str, Any]:
    (found,) = named(kind, name)
    return found


def doc_id(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def runtime_service() -> dict[str, Any]:
    """The Knative Service the control plane would create with the ConfigMap's settings."""
    cp, knative, _ = settings_from_deploy()
    pool = PoolSpec(name=cp.pool, device=cp.worker_device, max_workers=cp.max_workers)
    return make_service(pool, knative.pools[cp.pool], knative, allowed_storage=cp.allowed_storage)


def pod_labels() -> list[tuple[str, dict[str, str]]]:
    """Labels of every kind of pod in the namespace: the Deployments' and the runtime's."""
    found = [
        (d["metadata"]["name"], d["spec"]["template"]["metadata"]["labels"])
        for d in named("Deployment")
    ]
    found.append(("runtime", runtime_service()["spec"]["template"]["metadata"]["labels"]))
    return found


def container_env(deployment: str) -> dict[str, str]:
    """The environment the Deployment's container gets from the ConfigMap and the Secret."""
    (container,) = one("Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    sources = {("ConfigMap", d["metadata"]["name"]): d.get("data", {}) for d in named("ConfigMap")}
    sources |= {("Secret", d["metadata"]["name"]): d.get("stringData", {}) for d in named("Secret")}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(sources[("ConfigMap", source["configMapRef"]["name"])])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = sources[("Secret", ref["name"])][ref["key"]]
    return env


def settings_from_deploy() -> tuple[ControlPlaneSettings, KnativeSettings, ActivatorSettings]:
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("ZEROSERVE_")]:
            patch.delenv(name)
        for name, value in container_env("zeroserve-control-plane").items():
            patch.setenv(name, value)
        control_plane = ControlPlaneSettings()
        knative = KnativeSettings()
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("ZEROSERVE_")]:
            patch.delenv(name)
        for name, value in container_env("zeroserve-activator").items():
            patch.setenv(name, value)
        activator = ActivatorSettings()
    return control_plane, knative, activator


def test_kustomization_lists_every_file():
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    files = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    assert "namespace" not in kustomization  # it would move the knative-serving Role


@pytest.mark.parametrize("doc", [d for d in DOCS if d["kind"] not in CRD_KINDS], ids=doc_id)
def test_built_in_kinds_validate_against_kubernetes_schemas(doc: dict[str, Any]):
    assert kubernetes_errors(plain(doc)) == []
    assert metadata_errors(doc["metadata"], doc_id(doc)) == []


@pytest.mark.parametrize("doc", [d for d in DOCS if d["kind"] in CRD_KINDS], ids=doc_id)
def test_monitors_are_structurally_sound(doc: dict[str, Any]):
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert metadata_errors(doc["metadata"], doc_id(doc)) == []
    spec = doc["spec"]
    assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "podMetricsEndpoints"}
    selector = spec["selector"]["matchLabels"]
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    key = "endpoints" if doc["kind"] == "ServiceMonitor" else "podMetricsEndpoints"
    (endpoint,) = spec[key]
    assert set(endpoint) <= {"port", "path", "interval"}
    assert endpoint["path"] == "/metrics" and endpoint["interval"].endswith("s")
    if doc["kind"] == "ServiceMonitor":
        (service,) = [s for s in named("Service") if matches(selector, s["metadata"]["labels"])]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    else:
        # Knative renames the runtime container's port to "user-port" on the pod.
        assert endpoint["port"] == "user-port"
        assert matches(selector, runtime_service()["spec"]["template"]["metadata"]["labels"])


def test_every_resource_names_its_namespace():
    for doc in DOCS:
        if doc["kind"] == "Namespace":
            continue
        expected = "knative-serving" if "knative-config" in doc["metadata"]["name"] else NAMESPACE
        assert doc["metadata"].get("namespace") == expected, doc_id(doc)


@pytest.mark.parametrize("name", ["zeroserve-control-plane", "zeroserve-activator"])
def test_workloads_fit_together(name: str):
    deployment = one("Deployment", name)
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    (container,) = template["spec"]["containers"]
    ports = {p["name"] for p in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] in ports
    service = one("Service", name)
    assert matches(service["spec"]["selector"], labels)
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    assert matches(one("PodDisruptionBudget", name)["spec"]["selector"]["matchLabels"], labels)
    account = one("ServiceAccount", template["spec"]["serviceAccountName"])
    assert account["metadata"]["namespace"] == NAMESPACE
    security = container["securityContext"]
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["image"] == "zeroserve-platform"  # set by kustomization's images


def test_control_plane_runs_two_replicas_and_the_activator_autoscales():
    assert one("Deployment", "zeroserve-control-plane")["spec"]["replicas"] == 2
    hpa = one("HorizontalPodAutoscaler", "zeroserve-activator")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "zeroserve-activator")
    assert hpa["spec"]["minReplicas"] >= 2


def test_the_configuration_loads_into_every_settings_object():
    """Every ConfigMap key is a setting; together they make a valid runtime pool."""
    control_plane, knative, activator = settings_from_deploy()
    assert control_plane.backend == "knative"
    assert control_plane.admin_token is not None
    assert control_plane.state_url.startswith("rediss://")
    assert activator.state_url == control_plane.state_url
    assert knative.service_account in {d["metadata"]["name"] for d in named("ServiceAccount")}
    assert knative.namespace == NAMESPACE
    fields = {
        "ZEROSERVE_CONTROL_PLANE_": ControlPlaneSettings.model_fields,
        "ZEROSERVE_KNATIVE_": KnativeSettings.model_fields,
        "ZEROSERVE_ACTIVATOR_": ActivatorSettings.model_fields,
    }
    (config,) = named("ConfigMap")
    for key in config["data"]:
        prefix = next((p for p in fields if key.startswith(p)), None)
        if prefix is None:
            assert key in {"ZEROSERVE_ALLOWED_STORAGE", "ZEROSERVE_CACHE_DIR"}, key
        else:
            assert key[len(prefix) :].lower() in fields[prefix], key
    service = runtime_service()
    assert knative_service_errors(service) == []
    assert pod_template_errors(service) == []


def test_the_secret_holds_placeholders_only():
    (secret,) = named("Secret")
    assert all("REPLACE" in value for value in secret["stringData"].values())


def test_rbac_is_exactly_what_the_control_plane_calls():
    """The Kubernetes calls of backends/knative/api.py, and no more: no ClusterRole, no
    wildcard, pods and Knative objects in one namespace, three config maps and Knative's
    controller Deployment (its release) read-only."""
    assert named("ClusterRole") == [] and named("ClusterRoleBinding") == []
    rules = {
        (d["metadata"]["namespace"], group, resource, verb, tuple(rule.get("resourceNames", ())))
        for d in named("Role")
        for rule in d["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert not any("*" in (g, r, v) for _, g, r, v, _ in rules)
    needed = {
        # server-side apply creates the Service when absent, patches it otherwise
        ("serving.knative.dev", "services", "create"),
        ("serving.knative.dev", "services", "patch"),
        ("serving.knative.dev", "services", "get"),
        ("serving.knative.dev", "services", "delete"),
        ("serving.knative.dev", "revisions", "get"),
        ("serving.knative.dev", "revisions", "patch"),
        ("", "pods", "list"),
        ("", "pods", "patch"),
        ("", "pods", "delete"),
    }
    granted = {(g, r, v) for ns, g, r, v, _ in rules if ns == NAMESPACE}
    assert needed <= granted
    assert {r for _, r, _ in granted} == {"services", "revisions", "pods"}
    assert granted - needed <= {
        ("serving.knative.dev", "services", "list"),
        ("serving.knative.dev", "services", "watch"),
        ("serving.knative.dev", "revisions", "list"),
        ("serving.knative.dev", "revisions", "watch"),
        ("", "pods", "get"),
        ("", "pods", "watch"),
    }
    config = {(g, r, v, names) for ns, g, r, v, names in rules if ns == "knative-serving"}
    assert config == {
        ("", "configmaps", "get", ("config-features", "config-autoscaler", "config-defaults")),
        ("apps", "deployments", "get", (CONTROLLER_DEPLOYMENT,)),
    }
    for binding in named("RoleBinding"):
        (subject,) = binding["subjects"]
        assert subject["name"] == "zeroserve-control-plane"
        assert binding["roleRef"]["name"] in {r["metadata"]["name"] for r in named("Role")}


def test_network_policies_admit_only_whom_they_should():
    policies = {d["metadata"]["name"]: d["spec"] for d in named("NetworkPolicy")}
    assert policies["zeroserve-default-deny-ingress"] == {
        "podSelector": {},
        "policyTypes": ["Ingress"],
    }
    for spec in policies.values():
        selected = [
            n
            for n, labels in pod_labels()
            if matches(spec["podSelector"].get("matchLabels", {}), labels)
        ]
        assert selected, spec
    _, knative, activator = settings_from_deploy()
    runtime = policies["zeroserve-runtime"]
    (inference, grpc, queue_proxy) = runtime["ingress"]
    assert [p["port"] for p in inference["ports"]] == [knative.container_port]
    sources = [
        f["podSelector"]["matchLabels"] for f in inference["from"] if "namespaceSelector" not in f
    ]
    assert sorted(s["app.kubernetes.io/component"] for s in sources) == [
        "activator",
        "control-plane",
    ]
    # The runtime's gRPC port is the activator's alone.
    assert knative.grpc_port and [p["port"] for p in grpc["ports"]] == [knative.grpc_port]
    assert [
        f["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for f in grpc["from"]
    ] == ["activator"]
    # Knative reaches the queue-proxy only, never the data plane's ports.
    queue_ports = [p["port"] for p in queue_proxy["ports"]]
    assert knative.container_port not in queue_ports and knative.grpc_port not in queue_ports
    admin = policies["zeroserve-control-plane"]
    (rule,) = admin["ingress"]
    assert all("podSelector" in f for f in rule["from"])  # nobody else, not the internet
    assert [p["port"] for p in policies["zeroserve-activator"]["ingress"][0]["ports"]] == [
        activator.port,
        activator.grpc_port,
    ]


def test_the_activators_grpc_port_is_served_and_published_in_the_cluster():
    _, _, activator = settings_from_deploy()
    assert activator.grpc_port == 8001
    (container,) = one("Deployment", "zeroserve-activator")["spec"]["template"]["spec"][
        "containers"
    ]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": activator.port, "grpc": activator.grpc_port}
    service_ports = {p["name"]: p for p in one("Service", "zeroserve-activator")["spec"]["ports"]}
    assert service_ports["grpc"]["targetPort"] == "grpc"
    assert service_ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"


def test_the_ingress_exposes_the_activator_only():
    ingress = one("Ingress", "zeroserve")
    annotations = ingress["metadata"]["annotations"]
    assert ingress["spec"]["ingressClassName"] == "alb"
    assert annotations["alb.ingress.kubernetes.io/target-type"] == "ip"
    assert annotations["alb.ingress.kubernetes.io/scheme"] == "internet-facing"
    paths = [p for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
    assert {p["backend"]["service"]["name"] for p in paths} == {"zeroserve-activator"}
    assert {p["backend"]["service"]["port"]["name"] for p in paths} == {"http"}


def _ingress_prefixes() -> list[str]:
    ingress = one("Ingress", "zeroserve")
    paths = [p for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
    assert {p["pathType"] for p in paths} == {"Prefix"}
    return [p["path"] for p in paths]


def _under(path: str, prefix: str) -> bool:
    """Kubernetes' Prefix match: whole path elements, so /v2 matches /v2/x but not /v2x."""
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def test_the_ingress_publishes_the_activators_api_and_not_its_metrics():
    """Every route of the activator is public except /metrics, which Prometheus scrapes
    through the Service (the ServiceMonitor) and the internet must not see."""
    prefixes = _ingress_prefixes()
    assert sorted(prefixes) == ["/v1", "/v2"]
    activator_paths = {route.path for route in activator_routes if isinstance(route, Route)}
    assert "/metrics" in activator_paths
    for path in activator_paths - {"/metrics"}:
        assert any(_under(path, prefix) for prefix in prefixes), path
    assert not any(_under("/metrics", prefix) for prefix in prefixes)
    monitor = one("ServiceMonitor", "zeroserve-activator")
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    # The ALB health check must be a public path too (it goes to the same targets).
    health = one("Ingress", "zeroserve")["metadata"]["annotations"][
        "alb.ingress.kubernetes.io/healthcheck-path"
    ]
    assert health in activator_paths and any(_under(health, p) for p in prefixes)


def test_the_activator_may_drain_before_it_is_killed():
    _, _, activator = settings_from_deploy()
    spec = one("Deployment", "zeroserve-activator")["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] > (
        activator.readiness_propagation_s + activator.exit_timeout_s
    )


def test_the_activator_outlasts_the_load_balancers_idle_timeout():
    """AWS: a target's keep-alive must be longer than the ALB's idle timeout, or the target
    closes a connection the ALB is about to reuse and that request fails with 502."""
    annotations = one("Ingress", "zeroserve")["metadata"]["annotations"]
    attributes = dict(
        item.strip().split("=", 1)
        for item in annotations["alb.ingress.kubernetes.io/load-balancer-attributes"].split(",")
    )
    alb_idle_s = int(attributes["idle_timeout.timeout_seconds"])
    _, _, activator = settings_from_deploy()
    assert activator.keep_alive_timeout_s > alb_idle_s
