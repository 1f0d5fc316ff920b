# Knative Serving through its operator, configured for GPU runtime pools (see
# shared/research/knative-kserve.md, sections 1.5-1.8 and 2.3): pods may select and tolerate
# GPU nodes and mount the node-local model cache, a new pool starts at zero pods, and a
# revision survives slow GPU node provisioning and long requests. zeroserve's own activator
# talks to runtime pods directly, so Kourier (Knative's networking layer) stays internal.

resource "helm_release" "knative_operator" {
  name             = "knative-operator"
  namespace        = "knative-operator"
  create_namespace = true
  repository       = "https://knative.github.io/operator"
  chart            = "knative-operator"
  version          = var.chart_versions.knative_operator

  depends_on = [module.eks]
}

resource "kubectl_manifest" "knative_serving_namespace" {
  yaml_body = yamlencode({
    apiVersion = "v1"
    kind       = "Namespace"
    metadata   = { name = "knative-serving" }
  })

  depends_on = [module.eks]
}

# What goes into Knative's config maps (the operator writes config-<key> from each key).
# The control plane checks the flags its pools need at start and refuses to run without
# them (control_plane/backends/knative/requirements.py); tests/infra checks that these
# satisfy that check for the pools deploy/kubernetes describes.
locals {
  knative_config = {
    network = { "ingress-class" = "kourier.ingress.networking.knative.dev" }
    features = {
      "kubernetes.podspec-nodeselector"            = "enabled"
      "kubernetes.podspec-tolerations"             = "enabled"
      "kubernetes.podspec-affinity"                = "enabled"
      "kubernetes.podspec-volumes-hostpath"        = "enabled"
      "kubernetes.podspec-persistent-volume-claim" = "enabled"
      "kubernetes.podspec-persistent-volume-write" = "enabled"
    }
    autoscaler = {
      # A new runtime pool must not grab a GPU before a model asks for it.
      "allow-zero-initial-scale" = "true"
      "enable-scale-to-zero"     = "true"
    }
    defaults = {
      # At least the pools' timeoutSeconds (ZEROSERVE_KNATIVE_REVISION_TIMEOUT_S). Knative's
      # own activator keeps its 600 s termination grace period: the operator offers no
      # override for it, and zeroserve's traffic does not pass through it (README.md).
      "max-revision-timeout-seconds" = tostring(var.max_revision_timeout_s)
    }
    deployment = {
      # GPU node provisioning, a multi-GB image pull and a weight fetch easily pass
      # Knative's 600 s default, after which the revision would be failed. zeroserve's
      # pools also set their own (ZEROSERVE_KNATIVE_PROGRESS_DEADLINE_S), which wins.
      "progress-deadline" = "${var.progress_deadline_s}s"
    }
  }
}

resource "kubectl_manifest" "knative_serving" {
  yaml_body = yamlencode({
    apiVersion = "operator.knative.dev/v1beta1"
    kind       = "KnativeServing"
    metadata   = { name = "knative-serving", namespace = "knative-serving" }
    spec = {
      version = var.knative_serving_version
      ingress = {
        kourier = { enabled = true, "service-type" = "ClusterIP" }
      }
      config = local.knative_config
    }
  })

  depends_on = [helm_release.knative_operator, kubectl_manifest.knative_serving_namespace]
}
