"""Runtime pods fit the GPU nodes: infra/terraform/modules/pod-requests, evaluated by the real
``terraform`` CLI (the module needs no provider, so it runs here without a registry), against
an EKS node's allocatable computed independently from nodeadm's published reservations; and
the cluster settings the GPU pools depend on (the autoscaler's accelerator label, enforced
network policies, the vLLM pool's spawn start and /dev/shm).

Skipped, visibly, where the ``terraform`` binary is absent.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import hcl2
import pytest
import yaml

from control_plane.backends.knative.settings import KnativeSettings

ROOT = Path(__file__).resolve().parents[2]
TERRAFORM = ROOT / "infra" / "terraform"
MODULE = TERRAFORM / "modules" / "pod-requests"
# EC2: g6.xlarge has 4 vCPUs, 16 GiB, one L4; 4 ENIs of 15 IPv4 addresses.
G6_XLARGE = {"vcpus": 4, "memory_mib": 16 * 1024, "max_pods": 4 * (15 - 1) + 2}
# What the GPU node's DaemonSets and the queue-proxy ask for (the module's defaults).
DAEMONSETS = {"cpu_millis": 900, "memory_mib": 1024}
QUEUE_PROXY_CPU_MILLIS = 25

needs_terraform = pytest.mark.skipif(
    shutil.which("terraform") is None, reason="the terraform CLI is not installed"
)


def eks_allocatable(vcpus: int, memory_mib: int, max_pods: int) -> tuple[int, int]:
    """(millicores, MiB) kubelet offers pods on an AL2023 EKS node (nodeadm's kube-reserved
    and eviction threshold), with kubelet's capacity 5 % under EC2's nominal memory."""
    millis = vcpus * 1000
    bands = [(0, 1000, 600), (1000, 2000, 100), (2000, 4000, 50), (4000, millis, 25)]
    reserved_cpu = sum(max(min(millis, hi) - lo, 0) * bp // 10000 for lo, hi, bp in bands)
    reserved_memory = 11 * max_pods + 255 + 100
    return millis - reserved_cpu, int(memory_mib * 0.95) - reserved_memory


def quantity(value: str) -> int:
    """millicores of "2900m" / "3", MiB of "13312Mi" / "14Gi"."""
    for suffix, scale in (("m", 1), ("Mi", 1), ("Gi", 1024)):
        if value.endswith(suffix):
            return int(value[: -len(suffix)]) * scale
    return int(value) * 1000


def run_module(tmp_path: Path, instance_types: list[str]) -> subprocess.CompletedProcess[str]:
    work = tmp_path / "module"
    shutil.copytree(MODULE, work)
    env = {"TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1", "PATH": "/usr/bin:/bin"}
    env["PATH"] = f"{Path(shutil.which('terraform') or '').parent}:{env['PATH']}"
    env["HOME"] = str(tmp_path)
    subprocess.run(
        ["terraform", "init", "-input=false", "-no-color"],
        cwd=work, env=env, check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return subprocess.run(
        [
            "terraform", "apply", "-auto-approve", "-input=false", "-no-color",
            f"-var=instance_types={json.dumps(instance_types)}",
        ],
        cwd=work, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def outputs(tmp_path: Path, instance_types: list[str]) -> dict[str, Any]:
    applied = run_module(tmp_path, instance_types)
    assert applied.returncode == 0, applied.stderr
    shown = subprocess.run(
        ["terraform", "output", "-json", "-no-color"],
        cwd=tmp_path / "module", capture_output=True, text=True, timeout=60, check=True,
        env={"PATH": f"{Path(shutil.which('terraform') or '').parent}:/usr/bin:/bin",
             "HOME": str(tmp_path)},
    )  # fmt: skip
    return {k: v["value"] for k, v in json.loads(shown.stdout).items()}


@needs_terraform
def test_the_gpu_pods_fit_a_g6_xlarge(tmp_path: Path):
    found = outputs(tmp_path, ["g6.xlarge"])
    cpu, memory = quantity(found["cpu"]), quantity(found["memory"])
    free_cpu, free_memory = eks_allocatable(**G6_XLARGE)
    assert found["allocatable"]["g6.xlarge"] == {
        "cpu_millis": free_cpu,
        "memory_mib": free_memory,
        "pods": 1,
    }
    assert cpu + QUEUE_PROXY_CPU_MILLIS + DAEMONSETS["cpu_millis"] <= free_cpu
    assert memory + DAEMONSETS["memory_mib"] <= free_memory
    # The requests written by hand before did not fit: the pod never scheduled.
    assert 14 * 1024 + DAEMONSETS["memory_mib"] > free_memory
    # Not needlessly small either: within a rounding step of what is free.
    assert memory + 256 > free_memory - DAEMONSETS["memory_mib"]


@needs_terraform
def test_mixed_types_get_the_smallest_and_unknown_types_are_refused(tmp_path: Path):
    mixed = outputs(tmp_path / "a", ["g6e.xlarge", "g6.xlarge"])
    alone = outputs(tmp_path / "b", ["g6.xlarge"])
    assert (mixed["cpu"], mixed["memory"]) == (alone["cpu"], alone["memory"])
    refused = run_module(tmp_path / "c", ["g6.xlarge", "m7i.large"])
    assert refused.returncode != 0
    said = " ".join(refused.stderr.split())
    assert "without a row in infra/terraform/modules/pod-requests: m7i.large" in said


def _hcl(name: str) -> dict[str, Any]:
    with (TERRAFORM / name).open() as handle:
        loaded: dict[str, Any] = hcl2.load(handle)
    return loaded


def test_the_cluster_has_what_gpu_pools_need():
    (eks,) = [m['"eks"'] for m in _hcl("eks.tf")["module"] if '"eks"' in m]
    gpu_labels = eks["eks_managed_node_groups"]["gpu"]["labels"]
    assert "${(local.accelerator_label)}" in gpu_labels
    main = (TERRAFORM / "main.tf").read_text()
    assert 'accelerator_label = "k8s.amazonaws.com/accelerator"' in main
    assert re.search(r'\bg6 += "nvidia-l4"', main)
    vpc_cni = eks["addons"]["vpc-cni"]
    assert "enableNetworkPolicy" in vpc_cni["configuration_values"]
    assert '"true"' in vpc_cni["configuration_values"].replace("'", '"')


def test_the_pools_terraform_writes_are_what_the_backend_reads():
    pools = _hcl("pools.tf")["locals"][0]["knative_pools"]
    assert set(pools) == {"gpu", "vllm"}
    text = (TERRAFORM / "pools.tf").read_text()
    assert 'env      = { VLLM_WORKER_MULTIPROC_METHOD = "spawn" }' in text
    assert "shm_size = var.vllm_shm_size" in text
    assert text.count("module.gpu_pod_requests.memory") == 2
    zeroserve = (TERRAFORM / "zeroserve.tf").read_text()
    assert "jsonencode(local.knative_pools)" in zeroserve


def test_the_default_config_pools_fit_a_g6_xlarge():
    """deploy/kubernetes/config.yaml, applied without Terraform, asks for no more than the
    module gives a g6.xlarge (Terraform's default instance type)."""
    (config,) = [
        d
        for d in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "config.yaml").read_text())
        if d["kind"] == "ConfigMap"
    ]
    settings = KnativeSettings.model_validate(
        {"pools": json.loads(config["data"]["ZEROSERVE_KNATIVE_POOLS"])}
    )
    free_cpu, free_memory = eks_allocatable(**G6_XLARGE)
    for name, pool in settings.pools.items():
        assert quantity(pool.cpu) + QUEUE_PROXY_CPU_MILLIS + DAEMONSETS["cpu_millis"] <= free_cpu
        assert quantity(pool.memory) + DAEMONSETS["memory_mib"] <= free_memory, name
    assert settings.pools["vllm"].env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert settings.pools["vllm"].shm_size
