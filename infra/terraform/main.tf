data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

# Fails the plan if a named zone does not exist or is not available in the region.
data "aws_availability_zones" "selected" {
  state = "available"
  filter {
    name   = "zone-name"
    values = [for letter in var.availability_zone_letters : "${var.region}${letter}"]
  }
}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  azs        = sort(data.aws_availability_zones.selected.names)

  model_bucket  = var.model_bucket_name != "" ? var.model_bucket_name : "${var.cluster_name}-models-${local.account_id}"
  manifests_dir = var.manifests_dir != "" ? var.manifests_dir : "${path.module}/../../deploy/kubernetes"

  # deploy/kubernetes fixes the namespace (its kustomization sets none, on purpose).
  namespace = "zeroserve"

  # GPU nodes carry this label and taint; runtime pools select and tolerate them (the
  # Knative features podspec-nodeselector and podspec-tolerations let them). The label is
  # the one ZEROSERVE_KNATIVE_POOLS in deploy/kubernetes/config.yaml selects.
  gpu_label = { key = "zeroserve.io/node-pool", value = "gpu" }
  gpu_taint = { key = "nvidia.com/gpu", value = "true", effect = "NO_SCHEDULE" }

  # The cluster autoscaler's GPU label on AWS, valued with the GPU of the node group's first
  # instance type's family.
  accelerator_label = "k8s.amazonaws.com/accelerator"
  gpu_accelerators = {
    g4dn      = "nvidia-tesla-t4"
    g5        = "nvidia-a10g"
    g6        = "nvidia-l4"
    gr6       = "nvidia-l4"
    g6e       = "nvidia-l40s"
    p4d       = "nvidia-tesla-a100"
    p4de      = "nvidia-tesla-a100"
    p5        = "nvidia-h100"
    p5e       = "nvidia-h200"
    p5en      = "nvidia-h200"
    "p6-b200" = "nvidia-b200"
  }
  gpu_accelerator = lookup(local.gpu_accelerators, split(".", var.gpu_instance_types[0])[0], "nvidia")

  # The user of the runtime images (docker/, control_plane/backends/knative RUNTIME_UID):
  # it owns the node cache folder on GPU nodes.
  runtime_uid = 10001

  oidc_issuer = replace(module.eks.cluster_oidc_issuer_url, "https://", "")
}
