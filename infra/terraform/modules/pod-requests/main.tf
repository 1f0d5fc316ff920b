# The CPU and memory a runtime pod may request on a GPU node: the instance type's allocatable
# after EKS's reservations, less the DaemonSets' requests, shared by the node's pods (one per
# gpus_per_pod GPUs), less Knative's queue-proxy sidecar. With several instance types, the
# smallest answer, so that the pod fits on every node the group may bring.
#
# EKS's AL2023 nodes (nodeadm, awslabs/amazon-eks-ami nodeadm/internal/kubelet) set:
#   kube-reserved memory  = 11 MiB x max pods + 255 MiB
#   kube-reserved cpu     = 6 % of the first core, 1 % of the second, 0.5 % of the third and
#                           fourth, 0.25 % of every further core
#   eviction-hard         = memory.available 100Mi
#   max pods (VPC CNI)    = ENIs x (IPv4 addresses per ENI - 1) + 2
# Kubelet's memory capacity is the kernel's MemTotal, a few percent below EC2's nominal
# memory (firmware and the kernel keep the rest); memory_overhead_fraction accounts for it.

terraform {
  required_version = ">= 1.9"
}

variable "instance_types" {
  description = "Instance types of the GPU node group; each must be in this module's table."
  type        = list(string)
}

variable "gpus_per_pod" {
  description = "nvidia.com/gpu of each runtime pod; a node runs (its GPUs / this) pods."
  type        = number
  default     = 1
}

variable "daemonset_requests" {
  description = "Sum of the requests of the DaemonSets on a GPU node (kube-proxy 100m, aws-node 25m, ebs-csi-node 30m/120Mi, CloudWatch agent 250m/128Mi, Fluent Bit 50m/25Mi, DCGM exporter, NVIDIA device plugin), with a margin."
  type        = object({ cpu_millis = number, memory_mib = number })
  default     = { cpu_millis = 900, memory_mib = 1024 }
}

variable "sidecar_requests" {
  description = "Requests of Knative's queue-proxy in each pod (config-deployment's queue-sidecar-cpu-request defaults to 25m)."
  type        = object({ cpu_millis = number, memory_mib = number })
  default     = { cpu_millis = 25, memory_mib = 0 }
}

variable "memory_overhead_fraction" {
  description = "Share of EC2's nominal memory that kubelet does not see as capacity."
  type        = number
  default     = 0.05
}

locals {
  # vCPUs, memory (MiB) and GPUs (EC2's instance type pages); ENIs and IPv4 addresses per
  # ENI (nodeadm's instance-info.jsonl).
  shapes = {
    "g4dn.xlarge"   = { vcpus = 4, memory_mib = 16384, gpus = 1, enis = 3, ips = 10 }
    "g4dn.2xlarge"  = { vcpus = 8, memory_mib = 32768, gpus = 1, enis = 3, ips = 10 }
    "g4dn.4xlarge"  = { vcpus = 16, memory_mib = 65536, gpus = 1, enis = 3, ips = 10 }
    "g4dn.12xlarge" = { vcpus = 48, memory_mib = 196608, gpus = 4, enis = 8, ips = 30 }
    "g5.xlarge"     = { vcpus = 4, memory_mib = 16384, gpus = 1, enis = 4, ips = 15 }
    "g5.2xlarge"    = { vcpus = 8, memory_mib = 32768, gpus = 1, enis = 4, ips = 15 }
    "g5.4xlarge"    = { vcpus = 16, memory_mib = 65536, gpus = 1, enis = 8, ips = 30 }
    "g5.8xlarge"    = { vcpus = 32, memory_mib = 131072, gpus = 1, enis = 8, ips = 30 }
    "g5.12xlarge"   = { vcpus = 48, memory_mib = 196608, gpus = 4, enis = 15, ips = 50 }
    "g6.xlarge"     = { vcpus = 4, memory_mib = 16384, gpus = 1, enis = 4, ips = 15 }
    "g6.2xlarge"    = { vcpus = 8, memory_mib = 32768, gpus = 1, enis = 4, ips = 15 }
    "g6.4xlarge"    = { vcpus = 16, memory_mib = 65536, gpus = 1, enis = 8, ips = 30 }
    "g6.8xlarge"    = { vcpus = 32, memory_mib = 131072, gpus = 1, enis = 8, ips = 30 }
    "g6.12xlarge"   = { vcpus = 48, memory_mib = 196608, gpus = 4, enis = 8, ips = 30 }
    "g6e.xlarge"    = { vcpus = 4, memory_mib = 32768, gpus = 1, enis = 4, ips = 15 }
    "g6e.2xlarge"   = { vcpus = 8, memory_mib = 65536, gpus = 1, enis = 4, ips = 15 }
    "g6e.4xlarge"   = { vcpus = 16, memory_mib = 131072, gpus = 1, enis = 8, ips = 30 }
    "g6e.8xlarge"   = { vcpus = 32, memory_mib = 262144, gpus = 1, enis = 8, ips = 30 }
    "g6e.12xlarge"  = { vcpus = 48, memory_mib = 393216, gpus = 4, enis = 10, ips = 30 }
    "gr6.4xlarge"   = { vcpus = 16, memory_mib = 131072, gpus = 1, enis = 8, ips = 30 }
    "p4d.24xlarge"  = { vcpus = 96, memory_mib = 1179648, gpus = 8, enis = 15, ips = 50 }
    "p5.48xlarge"   = { vcpus = 192, memory_mib = 2097152, gpus = 8, enis = 2, ips = 50 }
  }

  unknown = [for t in var.instance_types : t if !contains(keys(local.shapes), t)]

  nodes = {
    for t in var.instance_types : t => merge(local.shapes[t], {
      max_pods   = local.shapes[t].enis * (local.shapes[t].ips - 1) + 2
      cpu_millis = local.shapes[t].vcpus * 1000
    }) if contains(keys(local.shapes), t)
  }

  allocatable = {
    for t, n in local.nodes : t => {
      cpu_millis = n.cpu_millis - floor((
        min(n.cpu_millis, 1000) * 600
        + max(min(n.cpu_millis, 2000) - 1000, 0) * 100
        + max(min(n.cpu_millis, 4000) - 2000, 0) * 50
        + max(n.cpu_millis - 4000, 0) * 25
      ) / 10000)
      memory_mib = floor(n.memory_mib * (1 - var.memory_overhead_fraction)) - (11 * n.max_pods + 255) - 100
      pods       = floor(n.gpus / var.gpus_per_pod)
    }
  }

  per_pod = {
    for t, a in local.allocatable : t => {
      cpu_millis = floor((a.cpu_millis - var.daemonset_requests.cpu_millis) / max(a.pods, 1)) - var.sidecar_requests.cpu_millis
      memory_mib = floor((a.memory_mib - var.daemonset_requests.memory_mib) / max(a.pods, 1)) - var.sidecar_requests.memory_mib
    }
  }

  # Rounded down: to 100m of CPU and 256 MiB of memory.
  cpu_millis = floor(min([for p in values(local.per_pod) : p.cpu_millis]...) / 100) * 100
  memory_mib = floor(min([for p in values(local.per_pod) : p.memory_mib]...) / 256) * 256
}

output "cpu" {
  description = "CPU request of a runtime pod (Kubernetes quantity)."
  value       = "${local.cpu_millis}m"

  precondition {
    condition     = length(local.unknown) == 0
    error_message = "Instance types without a row in infra/terraform/modules/pod-requests: ${join(", ", local.unknown)}; add them (vCPUs, memory, GPUs, ENIs, addresses per ENI)."
  }
  precondition {
    condition     = alltrue([for a in values(local.allocatable) : a.pods >= 1])
    error_message = "An instance type has fewer GPUs than gpus_per_pod."
  }
  precondition {
    condition     = local.cpu_millis >= 500 && local.memory_mib >= 2048
    error_message = "After EKS's reservations and the DaemonSets, a pod would get under 500m CPU or 2 GiB memory."
  }
}

output "memory" {
  description = "Memory request and limit of a runtime pod (Kubernetes quantity)."
  value       = "${local.memory_mib}Mi"
}

output "allocatable" {
  description = "Per instance type: allocatable CPU (millicores) and memory (MiB) after EKS's reservations, and the runtime pods per node."
  value       = local.allocatable
}
