"""infra/terraform and deploy/kubernetes agree: what one half sets is what the other needs.

Terraform builds the cluster (Knative, GPU nodes, IAM roles, kube-prometheus-stack) and then
applies deploy/kubernetes with a few values of its own merged in; the control plane checks
Knative's configuration at start and refuses to run without what its pools need. These
tests join the two halves without a cluster or a cloud: the Knative configuration Terraform
writes passes the control plane's own start-up check (``requirements_of`` and
``check_config`` from control_plane/backends/knative, not a copy of their list) for the
pools deploy/kubernetes describes, once Terraform's ConfigMap values are in; and the names,
labels, taints, paths and user ids that each half refers to exist in the other.

Terraform values are read from the parsed files (python-hcl2) with every variable at its
default, which is what the README's deploy steps use unless terraform.tfvars says otherwise.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

import hcl2
import pytest
import yaml

from activator.settings import ActivatorSettings
from control_plane.backends.base import PoolSpec
from control_plane.backends.knative.manifests import RUNTIME_UID, make_service
from control_plane.backends.knative.requirements import (
    DEFAULTS_CONFIG,
    Requirement,
    check_config,
    describe,
    requirements_of,
)
from control_plane.backends.knative.settings import KnativeSettings
from control_plane.settings import ControlPlaneSettings
from tests.deploy.test_kubernetes_manifests import DEPLOY, container_env, named, one
from tests.infra.test_terraform import TERRAFORM, _load, _named, _text

KNATIVE_NAMESPACE = "knative-serving"
_TOSTRING_VAR = re.compile(r"^\$\{tostring\(var\.(\w+)\)\}$")
_VAR = re.compile(r"^var\.(\w+)$")
_INTERPOLATED_VAR = re.compile(r"\$\{var\.(\w+)\}")
_INTERPOLATION = re.compile(r"\$\{[^}]*\}")
_TAINT_EFFECTS = {
    "NO_SCHEDULE": "NoSchedule",
    "NO_EXECUTE": "NoExecute",
    "PREFER_NO_SCHEDULE": "PreferNoSchedule",
}


def _default(variable: str) -> Any:
    value = _named("variable")[variable]["default"]
    return _text(value) if isinstance(value, str) else value


def _entries(mapping: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Key (unquoted) and value of a parsed HCL object, without python-hcl2's own keys."""
    for key, value in mapping.items():
        if not key.startswith("__"):
            yield _text(key), value


def _expression(raw: str) -> str:
    """A Terraform expression's value with every variable at its default; references to
    resources that exist only after an apply (the bucket's name) become ``example``."""
    if match := _TOSTRING_VAR.match(raw) or _VAR.match(raw):
        return str(_default(match.group(1)))
    text = raw[1:-1] if raw.startswith('"') and raw.endswith('"') else raw
    text = _INTERPOLATED_VAR.sub(lambda m: str(_default(m.group(1))), text)
    return _INTERPOLATION.sub("example", text)


def _local(path_name: str, name: str) -> Any:
    for entry in _load(TERRAFORM / path_name).get("locals", []):
        if name in entry:
            return entry[name]
    raise AssertionError(f"no local {name} in {path_name}")


def terraform_knative_config_maps() -> dict[str, dict[str, str]]:
    """Knative's config maps as the operator writes them from ``local.knative_config``:
    ``spec.config.<name>`` becomes config map ``config-<name>``."""
    config = _local("knative.tf", "knative_config")
    return {
        f"config-{name}": {key: _expression(value) for key, value in _entries(data)}
        for name, data in _entries(config)
    }


def terraform_config_values() -> dict[str, str]:
    """What zeroserve.tf merges into the ``zeroserve-config`` ConfigMap (its fixed part;
    ``ZEROSERVE_KNATIVE_POOLS`` is merged only when ``knative_pools`` is set)."""
    text = (TERRAFORM / "zeroserve.tf").read_text()
    block = text[text.index("cluster_config = merge(") :]
    block = block[: block.index("\n    },")]
    found = re.findall(r"^\s+([A-Z][A-Z0-9_]+)\s+=\s+(.+?)\s*$", block, re.MULTILINE)
    assert found, "no ConfigMap values in zeroserve.tf's cluster_config"
    return {key: _expression(value) for key, value in found}


def _settings(
    deployment: str, **knative: Any
) -> tuple[ControlPlaneSettings, KnativeSettings, ActivatorSettings]:
    """The settings a container of ``deployment`` gets once Terraform has merged its values
    into the ConfigMap (the Secret's placeholders stand in for the values Terraform puts
    there; the settings of the other components are read from the same environment)."""
    env = container_env(deployment) | terraform_config_values()
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith(("ZEROSERVE_", "AWS_"))]:
            patch.delenv(name)
        for name, value in env.items():
            patch.setenv(name, value)
        return ControlPlaneSettings(), KnativeSettings(**knative), ActivatorSettings()


def runtime_services(**knative: Any) -> list[dict[str, Any]]:
    """The Knative Service of the control plane's pool, as it builds it on the cluster."""
    control_plane, settings, _ = _settings("zeroserve-control-plane", **knative)
    pool = PoolSpec(
        name=control_plane.pool,
        device=control_plane.worker_device,
        max_workers=control_plane.max_workers,
    )
    template = settings.pools[control_plane.pool]
    return [make_service(pool, template, settings, allowed_storage=control_plane.allowed_storage)]


def _max_timeout_requirement(requirements: list[Requirement]) -> Requirement:
    (found,) = [r for r in requirements if r.config_map == DEFAULTS_CONFIG]
    assert found.at_least is not None
    return found


@pytest.mark.parametrize(
    "cache",
    [
        pytest.param({}, id="host-path-cache"),
        pytest.param({"cache_volume": "pvc", "cache_claim": "node-cache"}, id="pvc-cache"),
    ],
)
def test_terraforms_knative_config_passes_the_control_planes_start_up_check(
    cache: dict[str, Any],
) -> None:
    requirements = requirements_of(runtime_services(**cache))
    assert {r.config_map for r in requirements} >= {"config-features", "config-autoscaler"}
    config_maps = terraform_knative_config_maps()
    problems = check_config(requirements, config_maps)
    assert problems == [], describe(problems, KNATIVE_NAMESPACE)


def test_every_max_revision_timeout_terraform_accepts_is_enough() -> None:
    """The variable's validation, not only its default, keeps the check passing."""
    needed = _max_timeout_requirement(requirements_of(runtime_services())).at_least
    assert needed is not None
    [validation] = _named("variable")["max_revision_timeout_s"]["validation"]
    match = re.search(r"var\.max_revision_timeout_s >= (\d+)", validation["condition"])
    assert match, validation["condition"]
    assert int(match.group(1)) >= needed
    assert _default("max_revision_timeout_s") >= needed


def test_the_control_plane_may_read_the_config_maps_terraform_writes() -> None:
    requirements = requirements_of(runtime_services())
    needed = {r.config_map for r in requirements}
    assert needed <= set(terraform_knative_config_maps())
    (reader,) = [r for r in named("Role") if r["metadata"]["namespace"] == KNATIVE_NAMESPACE]
    (rule,) = [r for r in reader["rules"] if r["resources"] == ["configmaps"]]
    assert needed <= set(rule["resourceNames"])
    _, settings, _ = _settings("zeroserve-control-plane")
    assert settings.knative_namespace == KNATIVE_NAMESPACE
    knative_serving = (TERRAFORM / "knative.tf").read_text()
    assert f'namespace = "{KNATIVE_NAMESPACE}"' in knative_serving


def test_what_terraform_merges_into_the_config_map_is_settings() -> None:
    """Each key is a field of the component that reads it (as tests/deploy requires of
    config.yaml's), and with the values merged every settings object still loads."""
    fields = {
        "ZEROSERVE_CONTROL_PLANE_": ControlPlaneSettings.model_fields,
        "ZEROSERVE_KNATIVE_": KnativeSettings.model_fields,
        "ZEROSERVE_ACTIVATOR_": ActivatorSettings.model_fields,
    }
    values = terraform_config_values()
    for key in values:
        prefix = next((p for p in fields if key.startswith(p)), None)
        if prefix is None:
            assert key in {"ZEROSERVE_ALLOWED_STORAGE", "AWS_REGION", "AWS_DEFAULT_REGION"}, key
        else:
            assert key[len(prefix) :].lower() in fields[prefix], key
    control_plane, knative, _ = _settings("zeroserve-control-plane")
    _, _, activator = _settings("zeroserve-activator")
    assert control_plane.cloudwatch_enabled and activator.cloudwatch_enabled
    assert knative.cache_host_path == _default("node_cache_host_path")
    text = (TERRAFORM / "zeroserve.tf").read_text()
    assert "ZEROSERVE_KNATIVE_POOLS = var.knative_pools" in text


def test_the_deployed_activator_requires_api_keys() -> None:
    """The public ALB reaches the activator: both deploy/kubernetes and what Terraform
    merges set keys on, explicitly (not by the default alone)."""
    _, _, activator = _settings("zeroserve-activator")
    assert activator.auth == "keys"
    assert terraform_config_values()["ZEROSERVE_ACTIVATOR_AUTH"] == "keys"
    assert container_env("zeroserve-activator")["ZEROSERVE_ACTIVATOR_AUTH"] == "keys"


def test_serve_grpc_false_turns_off_grpc_where_deploy_kubernetes_turns_it_on() -> None:
    """deploy/kubernetes serves gRPC at the activator and on the runtime pods; Terraform's
    switch sets both of those settings to 0, and nothing else."""
    _, knative, activator = _settings("zeroserve-activator")
    assert activator.grpc_port and knative.grpc_port
    assert _default("serve_grpc") is True
    text = (TERRAFORM / "zeroserve.tf").read_text()
    start = "var.serve_grpc ? {} : {"
    block = text[text.index(start) + len(start) :]
    block = block[: block.index("}")]
    found = dict(re.findall(r"^\s+([A-Z][A-Z0-9_]+)\s+=\s+\"(.*)\"\s*$", block, re.MULTILINE))
    assert found == {"ZEROSERVE_ACTIVATOR_GRPC_PORT": "0", "ZEROSERVE_KNATIVE_GRPC_PORT": "0"}


def test_gpu_pools_select_and_tolerate_the_gpu_node_group() -> None:
    label = {key: _text(value) for key, value in _entries(_local("main.tf", "gpu_label"))}
    taint = {key: _text(value) for key, value in _entries(_local("main.tf", "gpu_taint"))}
    node_label = {label["key"]: label["value"]}
    _, settings, _ = _settings("zeroserve-control-plane")
    gpu_pools = {name: pool for name, pool in settings.pools.items() if pool.gpus > 0}
    assert gpu_pools
    for name, pool in gpu_pools.items():
        assert pool.node_selector.items() <= node_label.items(), name
        assert any(
            t.key == taint["key"]
            and t.effect in (None, _TAINT_EFFECTS[taint["effect"]])
            and (t.operator == "Exists" or t.value == taint["value"])
            for t in pool.tolerations
        ), f"pool {name} does not tolerate the GPU nodes' taint {taint}"


def test_the_node_cache_terraform_prepares_is_the_one_the_pods_mount() -> None:
    (service,) = runtime_services()
    (volume,) = [v for v in service["spec"]["template"]["spec"]["volumes"] if "hostPath" in v]
    assert volume["hostPath"]["path"] == _default("node_cache_host_path")
    assert int(_local("main.tf", "runtime_uid")) == RUNTIME_UID
    eks = (TERRAFORM / "eks.tf").read_text()
    # Made when kubelet starts, i.e. after nodeadm has mounted the instance-store array.
    assert "kubelet.service.d" in eks
    assert (
        "install -d -o ${local.runtime_uid} -g ${local.runtime_uid} -m 0750 "
        "${var.node_cache_host_path}"
    ) in eks


def test_identities_and_the_certificate_land_where_deploy_kubernetes_expects_them() -> None:
    accounts = {key: _text(value) for key, value in _default("service_accounts").items()}
    _, settings, _ = _settings("zeroserve-control-plane")
    assert settings.service_account == accounts["runtime"]
    for component in ("control_plane", "activator"):
        deployment = one("Deployment", f"zeroserve-{component.replace('_', '-')}")
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == accounts[component]
    overlay = (TERRAFORM / "zeroserve.tf").read_text()
    irsa = "eks.amazonaws.com/role-arn"
    assert f'"{irsa}"' in overlay
    # The runtime account's placeholder is under the same key, so the patch replaces it.
    assert irsa in one("ServiceAccount", accounts["runtime"])["metadata"]["annotations"]
    certificate = "alb.ingress.kubernetes.io/certificate-arn"
    assert f'"{certificate}"' in overlay
    assert certificate in one("Ingress", "zeroserve")["metadata"]["annotations"]


def test_prometheus_selects_and_may_scrape_the_monitors() -> None:
    (release,) = [
        body
        for path in sorted(TERRAFORM.glob("*.tf"))
        for entry in _load(path).get("resource", [])
        for type_, named_ in entry.items()
        if _text(type_) == "helm_release"
        for name, body in named_.items()
        if _text(name) == "kube_prometheus_stack"
    ]
    release_name, namespace = _text(release["name"]), _text(release["namespace"])
    monitors = named("ServiceMonitor") + named("PodMonitor")
    assert monitors
    for monitor in monitors:
        assert monitor["metadata"]["labels"]["release"] == release_name
    policies = [p["spec"] for p in named("NetworkPolicy")]
    prometheus_sources = [
        source["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        for spec in policies
        for rule in spec.get("ingress", [])
        for source in rule.get("from", [])
        if source.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name")
        == "prometheus"
    ]
    assert prometheus_sources and set(prometheus_sources) == {namespace}


def test_image_overrides_name_images_the_manifests_render_with() -> None:
    """kustomize renames images in deploy/kubernetes before Terraform's overlay sees them,
    so the overlay must key on the renamed image (the example's keys are checked)."""
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    renames = {i["name"]: i.get("newName", i["name"]) for i in kustomization["images"]}
    rendered = {
        renames.get(c["image"], c["image"])
        for d in named("Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    example = hcl2.loads((TERRAFORM / "terraform.tfvars.example").read_text())
    keys = {_text(key) for key, _ in _entries(example["images"])}
    assert keys and keys <= rendered, (keys, rendered)
    pools = json.loads(one("ConfigMap", "zeroserve-config")["data"]["ZEROSERVE_KNATIVE_POOLS"])
    # The runtime images are in the pools' JSON, which kustomize does not rewrite.
    assert not {pool["image"].rsplit(":", 1)[0] for pool in pools.values()} & keys
