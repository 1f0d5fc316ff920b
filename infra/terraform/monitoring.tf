# kube-prometheus-stack (Prometheus, Alertmanager, Grafana) with zeroserve's dashboard and
# alert rules from monitoring/, provisioned from the same files the tests check. The scrape
# targets (ServiceMonitors, and a PodMonitor for the runtime pods) come with
# deploy/kubernetes/monitoring.yaml; the release is named kube-prometheus-stack because
# those carry release: kube-prometheus-stack.

resource "kubectl_manifest" "monitoring_namespace" {
  yaml_body = yamlencode({
    apiVersion = "v1"
    kind       = "Namespace"
    metadata   = { name = "monitoring" }
  })

  depends_on = [module.eks]
}

resource "random_password" "grafana_admin" {
  length  = 32
  special = false
}

resource "kubectl_manifest" "grafana_admin" {
  yaml_body = yamlencode({
    apiVersion = "v1"
    kind       = "Secret"
    type       = "Opaque"
    metadata   = { name = "grafana-admin", namespace = "monitoring" }
    stringData = {
      "admin-user"     = "admin"
      "admin-password" = random_password.grafana_admin.result
    }
  })
  sensitive_fields = ["stringData"]

  depends_on = [kubectl_manifest.monitoring_namespace]
}

resource "helm_release" "kube_prometheus_stack" {
  name       = "kube-prometheus-stack"
  namespace  = "monitoring"
  repository = "https://prometheus-community.github.io/helm-charts"
  chart      = "kube-prometheus-stack"
  version    = var.chart_versions.kube_prometheus_stack
  timeout    = 900

  values = [yamlencode({
    prometheus = {
      prometheusSpec = {
        retention = var.prometheus_retention
        # Pick up every ServiceMonitor, PodMonitor and PrometheusRule, not only the chart's.
        serviceMonitorSelectorNilUsesHelmValues = false
        podMonitorSelectorNilUsesHelmValues     = false
        ruleSelectorNilUsesHelmValues           = false
        nodeSelector                            = { "zeroserve.io/node-role" = "platform" }
        storageSpec = {
          volumeClaimTemplate = {
            spec = {
              storageClassName = "ebs-csi-default-sc"
              accessModes      = ["ReadWriteOnce"]
              resources        = { requests = { storage = "${var.prometheus_volume_gib}Gi" } }
            }
          }
        }
      }
    }
    alertmanager = {
      alertmanagerSpec = { nodeSelector = { "zeroserve.io/node-role" = "platform" } }
    }
    grafana = {
      admin = {
        existingSecret = "grafana-admin"
        userKey        = "admin-user"
        passwordKey    = "admin-password" #checkov:skip=CKV_SECRET_6:The name of a key in the Secret, not a secret.
      }
      nodeSelector = { "zeroserve.io/node-role" = "platform" }
      sidecar = {
        dashboards = {
          enabled         = true
          label           = "grafana_dashboard"
          labelValue      = "1"
          searchNamespace = "ALL"
        }
      }
    }
  })]

  depends_on = [kubectl_manifest.grafana_admin, module.eks]
}

resource "kubectl_manifest" "grafana_dashboard" {
  yaml_body = yamlencode({
    apiVersion = "v1"
    kind       = "ConfigMap"
    metadata = {
      name      = "zeroserve-dashboard"
      namespace = "monitoring"
      labels    = { grafana_dashboard = "1" }
    }
    data = {
      "zeroserve.json" = file("${path.module}/../../monitoring/grafana/zeroserve.json")
    }
  })

  depends_on = [kubectl_manifest.monitoring_namespace]
}

resource "kubectl_manifest" "prometheus_rules" {
  yaml_body = yamlencode({
    apiVersion = "monitoring.coreos.com/v1"
    kind       = "PrometheusRule"
    metadata   = { name = "zeroserve", namespace = "monitoring" }
    spec       = yamldecode(file("${path.module}/../../monitoring/prometheus/zeroserve-rules.yaml"))
  })

  depends_on = [helm_release.kube_prometheus_stack]
}
