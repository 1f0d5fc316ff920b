provider "aws" {
  region = var.region

  default_tags {
    tags = merge(var.tags, {
      "app.kubernetes.io/part-of" = "zeroserve"
      "zeroserve/cluster"         = var.cluster_name
    })
  }
}

# The cluster providers authenticate with `aws eks get-token` (the AWS CLI on the machine
# that runs terraform), so no long-lived token lands in the state.
locals {
  cluster_exec = {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "aws"
    args        = ["eks", "get-token", "--cluster-name", module.eks.cluster_name, "--region", var.region]
  }
}

provider "helm" {
  kubernetes = {
    host                   = module.eks.cluster_endpoint
    cluster_ca_certificate = base64decode(module.eks.cluster_certificate_authority_data)
    exec                   = local.cluster_exec
  }
}

provider "kubectl" {
  host                   = module.eks.cluster_endpoint
  cluster_ca_certificate = base64decode(module.eks.cluster_certificate_authority_data)
  load_config_file       = false

  exec {
    api_version = local.cluster_exec.api_version
    command     = local.cluster_exec.command
    args        = local.cluster_exec.args
  }
}

provider "kustomization" {
  # Used to render deploy/kubernetes; kubectl_manifest applies what it renders. The provider
  # insists on a kubeconfig all the same: the cluster's, with the same exec authentication.
  kubeconfig_raw = yamlencode({
    apiVersion      = "v1"
    kind            = "Config"
    current-context = "zeroserve"
    clusters = [{
      name = "zeroserve"
      cluster = {
        server                     = module.eks.cluster_endpoint
        certificate-authority-data = module.eks.cluster_certificate_authority_data
      }
    }]
    contexts = [{ name = "zeroserve", context = { cluster = "zeroserve", user = "zeroserve" } }]
    users = [{
      name = "zeroserve"
      user = {
        exec = {
          apiVersion = local.cluster_exec.api_version
          command    = local.cluster_exec.command
          args       = local.cluster_exec.args
        }
      }
    }]
  })
}
