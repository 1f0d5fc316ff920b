terraform {
  # 1.9: variable validations may refer to other variables.
  required_version = ">= 1.9"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 6.28"
    }
    helm = {
      source  = "hashicorp/helm"
      version = "~> 3.1"
    }
    # kubectl_manifest applies custom resources (KnativeServing, PrometheusRule) whose CRDs
    # a helm release installs in the same apply; the kubernetes provider's manifest resource
    # needs them at plan time.
    kubectl = {
      source  = "alekc/kubectl"
      version = "~> 2.1"
    }
    # Renders deploy/kubernetes (a kustomization) with this cluster's values.
    kustomization = {
      source  = "kbst/kustomization"
      version = "~> 0.9"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.7"
    }
  }
}
