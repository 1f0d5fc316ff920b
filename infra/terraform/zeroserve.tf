# zeroserve itself: deploy/kubernetes (a kustomization, written to be applied as it is),
# rendered with this cluster's values and applied object by object. What Terraform changes
# in it, by kustomize, and nothing else:
#   ConfigMap zeroserve-config   merged: the model bucket, the region, CloudWatch on, the
#                                node cache folder on local NVMe, the pools (pools.tf, or
#                                knative_pools; gRPC off, if serve_grpc is false)
#   Secret    zeroserve-secrets  replaced: the admin token and the Redis URL (TLS, auth)
#   ServiceAccounts              annotated with their IRSA roles
#   Ingress   zeroserve          the ACM certificate, when acm_certificate_arn is set
#   images                       var.images

resource "random_password" "admin_token" {
  length  = 40
  special = false
}

locals {
  redis_url = format(
    "rediss://:%s@%s:%d/0",
    random_password.redis_auth.result,
    aws_elasticache_replication_group.state.primary_endpoint_address,
    aws_elasticache_replication_group.state.port,
  )

  cluster_config = merge(
    {
      AWS_REGION                                 = var.region
      AWS_DEFAULT_REGION                         = var.region
      ZEROSERVE_ALLOWED_STORAGE                  = "s3://${aws_s3_bucket.models.bucket}/${trimsuffix(var.model_prefix, "/")}"
      ZEROSERVE_CONTROL_PLANE_CLOUDWATCH_ENABLED = "true"
      ZEROSERVE_ACTIVATOR_CLOUDWATCH_ENABLED     = "true"
      # The ALB is internet-facing: every model endpoint needs an API key.
      ZEROSERVE_ACTIVATOR_AUTH = "keys"
      ZEROSERVE_KNATIVE_CACHE_HOST_PATH          = var.node_cache_host_path
    },
    { ZEROSERVE_KNATIVE_POOLS = var.knative_pools != "" ? var.knative_pools : jsonencode(local.knative_pools) },
    # The gRPC port itself is deploy/kubernetes' (the ConfigMap, the activator's container and
    # Service ports, the network policies agree on it); the nodes' security group already
    # admits node-to-node traffic on ports above 1024, where it is, as for the HTTP ports.
    var.serve_grpc ? {} : {
      ZEROSERVE_ACTIVATOR_GRPC_PORT = "0"
      ZEROSERVE_KNATIVE_GRPC_PORT   = "0"
    },
  )

  cluster_secrets = {
    ZEROSERVE_ADMIN_TOKEN = random_password.admin_token.result
    ZEROSERVE_STATE_URL   = local.redis_url
  }

  service_account_roles = {
    (var.service_accounts.runtime)       = aws_iam_role.irsa["runtime"].arn
    (var.service_accounts.control_plane) = aws_iam_role.irsa["control_plane"].arn
    (var.service_accounts.activator)     = aws_iam_role.irsa["activator"].arn
  }
}

data "kustomization_overlay" "zeroserve" {
  count = var.deploy_zeroserve ? 1 : 0

  resources = [local.manifests_dir]

  dynamic "images" {
    for_each = var.images
    content {
      name     = images.key
      new_name = images.value.new_name
      new_tag  = images.value.new_tag
    }
  }

  config_map_generator {
    name      = "zeroserve-config"
    namespace = local.namespace
    behavior  = "merge"
    literals  = [for key, value in local.cluster_config : "${key}=${value}"]
    options {
      disable_name_suffix_hash = true
    }
  }

  secret_generator {
    name      = "zeroserve-secrets"
    namespace = local.namespace
    type      = "Opaque"
    behavior  = "replace"
    literals  = [for key, value in local.cluster_secrets : "${key}=${value}"]
    options {
      disable_name_suffix_hash = true
    }
  }

  dynamic "patches" {
    for_each = local.service_account_roles
    content {
      target {
        kind      = "ServiceAccount"
        name      = patches.key
        namespace = local.namespace
      }
      patch = yamlencode({
        apiVersion = "v1"
        kind       = "ServiceAccount"
        metadata = {
          name        = patches.key
          namespace   = local.namespace
          annotations = { "eks.amazonaws.com/role-arn" = patches.value }
        }
      })
    }
  }

  dynamic "patches" {
    for_each = var.acm_certificate_arn != "" ? [var.acm_certificate_arn] : []
    content {
      target {
        kind      = "Ingress"
        name      = "zeroserve"
        namespace = local.namespace
      }
      patch = yamlencode({
        apiVersion = "networking.k8s.io/v1"
        kind       = "Ingress"
        metadata = {
          name        = "zeroserve"
          namespace   = local.namespace
          annotations = { "alb.ingress.kubernetes.io/certificate-arn" = patches.value }
        }
      })
    }
  }
}

locals {
  overlay = var.deploy_zeroserve ? data.kustomization_overlay.zeroserve[0] : null
  # kustomize's priority order: namespaces and CRDs, then everything else, then webhooks.
  zeroserve_ids = local.overlay != null ? local.overlay.ids_prio : [[], [], []]
}

resource "kubectl_manifest" "zeroserve_first" {
  for_each = toset(local.zeroserve_ids[0])

  yaml_body         = local.overlay.manifests[each.value]
  server_side_apply = true

  depends_on = [kubectl_manifest.knative_serving]
}

resource "kubectl_manifest" "zeroserve" {
  for_each = toset(local.zeroserve_ids[1])

  yaml_body         = local.overlay.manifests[each.value]
  server_side_apply = true

  depends_on = [
    kubectl_manifest.zeroserve_first,
    helm_release.kube_prometheus_stack,        # the ServiceMonitor and PodMonitor kinds
    helm_release.aws_load_balancer_controller, # its webhook admits the Ingress
  ]
}

resource "kubectl_manifest" "zeroserve_last" {
  for_each = toset(local.zeroserve_ids[2])

  yaml_body         = local.overlay.manifests[each.value]
  server_side_apply = true

  depends_on = [kubectl_manifest.zeroserve]
}
