module "eks" {
  #checkov:skip=CKV_TF_1:Registry modules are pinned to an exact released version; the registry does not serve commit hashes.
  source  = "terraform-aws-modules/eks/aws"
  version = "21.19.0"

  name               = var.cluster_name
  kubernetes_version = var.kubernetes_version

  vpc_id     = module.vpc.vpc_id
  subnet_ids = module.vpc.private_subnets

  # The API is reachable privately from the VPC, and publicly only from api_allowed_cidrs.
  endpoint_private_access      = true
  endpoint_public_access       = true
  endpoint_public_access_cidrs = var.api_allowed_cidrs

  enable_cluster_creator_admin_permissions = true
  enable_irsa                              = true

  enabled_log_types                      = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
  cloudwatch_log_group_retention_in_days = var.log_retention_days
  cloudwatch_log_group_kms_key_id        = aws_kms_key.platform.arn

  # Kubernetes secrets (the Redis URL and admin token among them) are envelope-encrypted
  # with a key the module creates.
  create_kms_key = true
  encryption_config = {
    resources = ["secrets"]
  }

  addons = {
    coredns    = {}
    kube-proxy = {}
    vpc-cni = {
      before_compute = true
      # The CNI's network policy agent: without it the API server takes NetworkPolicies and
      # nothing enforces them (deploy/kubernetes/networkpolicies.yaml).
      configuration_values = jsonencode({
        enableNetworkPolicy = "true"
      })
    }
    aws-ebs-csi-driver = {
      service_account_role_arn = aws_iam_role.irsa["ebs_csi"].arn
      # A default gp3 StorageClass, encrypted, for Prometheus's volume.
      configuration_values = jsonencode({
        defaultStorageClass = { enabled = true }
      })
    }
    # Container Insights metrics and container logs (Fluent Bit) to CloudWatch; the log
    # groups it writes to are created in cloudwatch.tf with a retention and a KMS key.
    amazon-cloudwatch-observability = {
      service_account_role_arn = aws_iam_role.irsa["cloudwatch_agent"].arn
    }
  }

  eks_managed_node_groups = {
    cpu = {
      ami_type       = "AL2023_x86_64_STANDARD"
      instance_types = var.cpu_instance_types
      min_size       = var.cpu_node_count.min
      desired_size   = var.cpu_node_count.desired
      max_size       = var.cpu_node_count.max
      labels = {
        "zeroserve.io/node-role" = "platform"
      }
    }

    gpu = {
      # Amazon Linux 2023 with the NVIDIA driver and container toolkit; the device plugin
      # (nvidia.tf) advertises nvidia.com/gpu.
      ami_type       = "AL2023_x86_64_NVIDIA"
      instance_types = var.gpu_instance_types
      capacity_type  = var.gpu_capacity_type
      min_size       = var.gpu_node_count.min
      max_size       = var.gpu_node_count.max
      # The cluster autoscaler owns the size from here on (the module ignores later drift).
      desired_size = var.gpu_node_count.min
      labels = {
        (local.gpu_label.key) = local.gpu_label.value
        # The cluster autoscaler treats a node with this label as a GPU node: it waits for
        # the device plugin to advertise nvidia.com/gpu instead of judging the new node
        # useless for the pending GPU pod and bringing yet another one.
        (local.accelerator_label) = local.gpu_accelerator
      }
      # Only pods that tolerate the GPU taint (runtime pools, the device plugin) land here.
      taints = {
        gpu = local.gpu_taint
      }
      block_device_mappings = {
        root = {
          device_name = "/dev/xvda"
          ebs = {
            volume_size           = var.gpu_root_volume_gib
            volume_type           = "gp3"
            encrypted             = true
            delete_on_termination = true
          }
        }
      }
      # Instance-store NVMe as one RAID0 array mounted at /mnt/k8s-disks/0: the node-local
      # model cache (and containerd's image store) get local-disk bandwidth.
      cloudinit_pre_nodeadm = [{
        content_type = "application/node.eks.aws"
        content      = <<-EOT
          apiVersion: node.eks.aws/v1alpha1
          kind: NodeConfig
          spec:
            instance:
              localStorage:
                strategy: RAID0
        EOT
      }]
      # The node cache folder, on that array, writable by the runtime image's user (10001).
      # This script runs in cloud-init's final stage, but nodeadm mounts the array only
      # afterwards (its run phase, nodeadm-run.service, just before it starts kubelet): a
      # folder made here would end up hidden under the mount, and kubelet would create an
      # empty one owned by root. So kubelet makes it each time it starts, after the mount.
      cloudinit_post_nodeadm = [{
        content_type = "text/x-shellscript; charset=\"us-ascii\""
        content      = <<-EOT
          #!/bin/bash
          set -euo pipefail
          mkdir -p /etc/systemd/system/kubelet.service.d
          cat > /etc/systemd/system/kubelet.service.d/90-zeroserve-node-cache.conf <<'UNIT'
          [Service]
          ExecStartPre=/usr/bin/install -d -o ${local.runtime_uid} -g ${local.runtime_uid} -m 0750 ${var.node_cache_host_path}
          UNIT
          systemctl daemon-reload
        EOT
      }]
    }
  }
}

# ---- GPU: the NVIDIA device plugin, and the autoscaler that brings GPU nodes from zero ----

resource "helm_release" "nvidia_device_plugin" {
  name       = "nvidia-device-plugin"
  namespace  = "kube-system"
  repository = "https://nvidia.github.io/k8s-device-plugin"
  chart      = "nvidia-device-plugin"
  version    = var.chart_versions.nvidia_device_plugin

  values = [yamlencode({
    # The chart's default affinity wants Node Feature Discovery labels; our GPU nodes carry
    # our own label instead.
    affinity     = null
    nodeSelector = { (local.gpu_label.key) = local.gpu_label.value }
    tolerations = [{
      key      = local.gpu_taint.key
      operator = "Exists"
      effect   = "NoSchedule"
    }]
  })]

  depends_on = [module.eks]
}

resource "helm_release" "cluster_autoscaler" {
  name       = "cluster-autoscaler"
  namespace  = "kube-system"
  repository = "https://kubernetes.github.io/autoscaler"
  chart      = "cluster-autoscaler"
  version    = var.chart_versions.cluster_autoscaler

  values = [yamlencode({
    awsRegion     = var.region
    cloudProvider = "aws"
    autoDiscovery = { clusterName = module.eks.cluster_name }
    rbac = {
      serviceAccount = {
        name        = "cluster-autoscaler"
        annotations = { "eks.amazonaws.com/role-arn" = aws_iam_role.irsa["cluster_autoscaler"].arn }
      }
    }
    nodeSelector = { "zeroserve.io/node-role" = "platform" }
    extraArgs = {
      # A GPU node that no runtime pod uses costs dollars per hour: remove it soon.
      "scale-down-unneeded-time"      = "5m"
      "scale-down-delay-after-add"    = "5m"
      "expander"                      = "least-waste"
      "balance-similar-node-groups"   = true
      "skip-nodes-with-local-storage" = false
    }
  })]

  depends_on = [module.eks]
}

# ---- the AWS Load Balancer Controller: the public ALB of deploy/kubernetes/ingress.yaml ----

module "lb_controller_irsa" {
  #checkov:skip=CKV_TF_1:Registry modules are pinned to an exact released version; the registry does not serve commit hashes.
  source  = "terraform-aws-modules/iam/aws//modules/iam-role-for-service-accounts"
  version = "6.5.0"

  name                                   = "${var.cluster_name}-lb-controller"
  attach_load_balancer_controller_policy = true
  oidc_providers = {
    cluster = {
      provider_arn               = module.eks.oidc_provider_arn
      namespace_service_accounts = ["kube-system:aws-load-balancer-controller"]
    }
  }
}

resource "helm_release" "aws_load_balancer_controller" {
  name       = "aws-load-balancer-controller"
  namespace  = "kube-system"
  repository = "https://aws.github.io/eks-charts"
  chart      = "aws-load-balancer-controller"
  version    = var.chart_versions.aws_load_balancer_controller

  values = [yamlencode({
    clusterName = module.eks.cluster_name
    region      = var.region
    vpcId       = module.vpc.vpc_id
    serviceAccount = {
      name        = "aws-load-balancer-controller"
      annotations = { "eks.amazonaws.com/role-arn" = module.lb_controller_irsa.arn }
    }
    nodeSelector = { "zeroserve.io/node-role" = "platform" }
  })]

  depends_on = [module.eks]
}
