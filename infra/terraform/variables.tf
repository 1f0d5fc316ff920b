# ---- where and what ----

variable "region" {
  description = "AWS region for everything (EKS, S3, ElastiCache, CloudWatch)."
  type        = string
  default     = "us-east-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-gov)?-[a-z]+-[0-9]$", var.region))
    error_message = "region must be an AWS region name such as us-east-1."
  }
}

variable "cluster_name" {
  description = "Name of the EKS cluster; also prefixes every other resource's name."
  type        = string
  default     = "zeroserve"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,30}[a-z0-9]$", var.cluster_name))
    error_message = "cluster_name must be 3-32 lowercase letters, digits or dashes, starting with a letter."
  }
}

variable "tags" {
  description = "Extra tags put on every AWS resource."
  type        = map(string)
  default     = {}
}

# ---- network ----

variable "vpc_cidr" {
  description = "CIDR block of the VPC; split into public and private subnets across the availability zones."
  type        = string
  default     = "10.42.0.0/16"

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0)) && tonumber(split("/", var.vpc_cidr)[1]) <= 20
    error_message = "vpc_cidr must be a valid IPv4 CIDR of /20 or larger."
  }
}

variable "availability_zone_letters" {
  description = "Availability zones to spread subnets, nodes and Redis over, as letters after the region (a, b, c: us-east-1a, ...). Named, not counted, so a zone AWS adds later never moves anything."
  type        = list(string)
  default     = ["a", "b", "c"]

  validation {
    condition     = length(var.availability_zone_letters) >= 2 && length(var.availability_zone_letters) <= 4 && alltrue([for l in var.availability_zone_letters : can(regex("^[a-z]$", l))])
    error_message = "availability_zone_letters must be 2 to 4 single letters (EKS and Multi-AZ Redis need two zones)."
  }
}

variable "single_nat_gateway" {
  description = "One NAT gateway for all zones (cheaper) instead of one per zone (survives a zone outage)."
  type        = bool
  default     = true
}

variable "api_allowed_cidrs" {
  description = "CIDR blocks allowed to reach the EKS API server's public endpoint (your office or CI)."
  type        = list(string)

  validation {
    condition     = length(var.api_allowed_cidrs) > 0 && alltrue([for c in var.api_allowed_cidrs : can(cidrnetmask(c))])
    error_message = "api_allowed_cidrs must be a non-empty list of IPv4 CIDR blocks."
  }
}

# ---- EKS ----

variable "kubernetes_version" {
  description = "EKS Kubernetes minor version."
  type        = string
  default     = "1.34"

  validation {
    condition     = can(regex("^1\\.[0-9]{2}$", var.kubernetes_version))
    error_message = "kubernetes_version must look like 1.34."
  }
}

variable "cpu_instance_types" {
  description = "Instance types of the CPU node group (control plane, activator, Knative, Prometheus)."
  type        = list(string)
  default     = ["m7i.xlarge"]

  validation {
    condition     = length(var.cpu_instance_types) > 0
    error_message = "cpu_instance_types must name at least one instance type."
  }
}

variable "cpu_node_count" {
  description = "Minimum, desired-at-creation and maximum size of the CPU node group."
  type        = object({ min = number, desired = number, max = number })
  default     = { min = 2, desired = 2, max = 6 }

  validation {
    condition     = var.cpu_node_count.min >= 1 && var.cpu_node_count.min <= var.cpu_node_count.desired && var.cpu_node_count.desired <= var.cpu_node_count.max
    error_message = "cpu_node_count needs 1 <= min <= desired <= max."
  }
}

variable "gpu_instance_types" {
  description = "Instance types of the GPU node group (NVIDIA, with local NVMe for the node cache: g6, g6e, g5, p5)."
  type        = list(string)
  default     = ["g6.xlarge"]

  validation {
    condition     = length(var.gpu_instance_types) > 0 && alltrue([for t in var.gpu_instance_types : can(regex("^(g4dn|g5|g6|g6e|gr6|p4d|p4de|p5|p5e|p5en|p6-b200)\\.", t))])
    error_message = "gpu_instance_types must be NVIDIA GPU instance types (g4dn, g5, g6, g6e, gr6, p4d, p5, p6)."
  }
}

variable "gpu_node_count" {
  description = "Minimum and maximum size of the GPU node group; min 0 lets the cluster autoscaler remove every GPU node when no model is loaded."
  type        = object({ min = number, max = number })
  default     = { min = 0, max = 4 }

  validation {
    condition     = var.gpu_node_count.min >= 0 && var.gpu_node_count.min <= var.gpu_node_count.max && var.gpu_node_count.max >= 1
    error_message = "gpu_node_count needs 0 <= min <= max and max >= 1."
  }
}

variable "gpu_capacity_type" {
  description = "ON_DEMAND or SPOT for GPU nodes (spot is cheaper; a reclaimed node's models are activated elsewhere)."
  type        = string
  default     = "ON_DEMAND"

  validation {
    condition     = contains(["ON_DEMAND", "SPOT"], var.gpu_capacity_type)
    error_message = "gpu_capacity_type must be ON_DEMAND or SPOT."
  }
}

variable "gpu_root_volume_gib" {
  description = "Root volume of GPU nodes in GiB (CUDA and vLLM images are large; the model cache lives on local NVMe)."
  type        = number
  default     = 150

  validation {
    condition     = var.gpu_root_volume_gib >= 50 && var.gpu_root_volume_gib <= 2000
    error_message = "gpu_root_volume_gib must be between 50 and 2000."
  }
}

# ---- data ----

variable "model_bucket_name" {
  description = "Name of the S3 bucket for model weights; empty: <cluster_name>-models-<account id>."
  type        = string
  default     = ""

  validation {
    condition     = var.model_bucket_name == "" || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.model_bucket_name))
    error_message = "model_bucket_name must be a valid S3 bucket name (3-63 lowercase letters, digits, dots, dashes)."
  }
}

variable "model_prefix" {
  description = "Key prefix under which models live in the bucket; runtime pods may read only below it."
  type        = string
  default     = "models/"

  validation {
    condition     = can(regex("^([A-Za-z0-9!_.*'()-]+/)+$", var.model_prefix))
    error_message = "model_prefix must be one or more path segments, each ending with /, e.g. models/."
  }
}

variable "model_writer_arns" {
  description = "IAM principals (users or roles, e.g. your CI's) allowed to upload and delete models; when set, the bucket policy denies writes by anyone else. Nothing in the cluster can write."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.model_writer_arns : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/.+$", arn))])
    error_message = "model_writer_arns must be IAM role or user ARNs."
  }
}

variable "noncurrent_model_version_days" {
  description = "Days an overwritten or deleted model object version is kept before S3 expires it."
  type        = number
  default     = 30

  validation {
    condition     = var.noncurrent_model_version_days >= 1
    error_message = "noncurrent_model_version_days must be at least 1."
  }
}

variable "redis_node_type" {
  description = "ElastiCache node type for the state store (placements, registry, leases: small)."
  type        = string
  default     = "cache.t4g.small"

  validation {
    condition     = startswith(var.redis_node_type, "cache.")
    error_message = "redis_node_type must be an ElastiCache node type such as cache.t4g.small."
  }
}

variable "redis_engine_version" {
  description = "Redis OSS engine version of the state store."
  type        = string
  default     = "7.1"

  validation {
    condition     = can(regex("^[67]\\.[0-9]+$", var.redis_engine_version))
    error_message = "redis_engine_version must be a Redis 6.x or 7.x version such as 7.1."
  }
}

# ---- the platform on the cluster ----

variable "acm_certificate_arn" {
  description = "ACM certificate of the public host name, for the ALB's HTTPS listener (deploy/kubernetes/ingress.yaml); request or import it in ACM first. Required with deploy_zeroserve: the manifest's placeholder would leave the ALB without a listener."
  type        = string
  default     = ""

  validation {
    condition     = var.acm_certificate_arn == "" || can(regex("^arn:aws[a-z-]*:acm:[a-z0-9-]+:[0-9]{12}:certificate/.+$", var.acm_certificate_arn))
    error_message = "acm_certificate_arn must be an ACM certificate ARN."
  }

  # Terraform >= 1.9 (versions.tf): a validation may refer to another variable.
  validation {
    condition     = var.acm_certificate_arn != "" || !var.deploy_zeroserve
    error_message = "acm_certificate_arn is required when deploy_zeroserve is true (the public Ingress needs it)."
  }
}

variable "knative_pools" {
  description = "ZEROSERVE_KNATIVE_POOLS (JSON: runtime image, GPUs, node selector, tolerations per pool); empty: the gpu and vllm pools of pools.tf, with requests computed for gpu_instance_types."
  type        = string
  default     = ""

  validation {
    condition     = var.knative_pools == "" || can(jsondecode(var.knative_pools))
    error_message = "knative_pools must be JSON (or empty)."
  }
}

variable "runtime_images" {
  description = "Runtime images of the pools pools.tf writes (docker/runtime-cuda.Dockerfile, docker/runtime-vllm.Dockerfile); pin them by digest in production."
  type        = object({ cuda = string, vllm = string })
  default = {
    cuda = "ghcr.io/zeroserve/runtime-cuda:0.1.0"
    vllm = "ghcr.io/zeroserve/runtime-vllm:0.1.0"
  }

  validation {
    condition     = alltrue([for image in values(var.runtime_images) : length(image) > 0 && !can(regex("\\s", image))])
    error_message = "runtime_images must be image references without spaces."
  }
}

variable "vllm_shm_size" {
  description = "Size of the vLLM pool's memory-backed /dev/shm (counts against the pod's memory limit)."
  type        = string
  default     = "2Gi"

  validation {
    condition     = can(regex("^[0-9]+(Mi|Gi)$", var.vllm_shm_size))
    error_message = "vllm_shm_size must be a quantity in Mi or Gi, like 2Gi."
  }
}

variable "service_accounts" {
  description = "Names of zeroserve's Kubernetes service accounts in namespace zeroserve (as deploy/kubernetes names them); each gets its own IAM role."
  type = object({
    control_plane = string
    activator     = string
    runtime       = string
  })
  default = {
    control_plane = "zeroserve-control-plane"
    activator     = "zeroserve-activator"
    runtime       = "zeroserve-runtime"
  }

  validation {
    condition     = alltrue([for name in values(var.service_accounts) : can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", name))])
    error_message = "service account names must be DNS labels."
  }
}

variable "serve_grpc" {
  description = "Serve gRPC (Triton's inference service) at the activator, for clients in the cluster, and on the runtime pods behind it, on the port deploy/kubernetes gives (8001); false sets ZEROSERVE_ACTIVATOR_GRPC_PORT and ZEROSERVE_KNATIVE_GRPC_PORT to 0."
  type        = bool
  default     = true
}

variable "deploy_zeroserve" {
  description = "Apply zeroserve itself from deploy/kubernetes (a kustomization); false stops after the cluster and its add-ons."
  type        = bool
  default     = true
}

variable "manifests_dir" {
  description = "Folder of zeroserve's kustomization; empty: deploy/kubernetes in this repository."
  type        = string
  default     = ""

  validation {
    condition     = var.manifests_dir == "" || !can(regex("\\.ya?ml$", var.manifests_dir))
    error_message = "manifests_dir must be the folder that holds kustomization.yaml, not a file."
  }
}

variable "images" {
  description = "Image overrides on top of deploy/kubernetes: image name as it renders (after its kustomization.yaml's own images:, so ghcr.io/zeroserve/platform, not zeroserve-platform) => new name and tag (e.g. your registry). The runtime images are named in knative_pools."
  type        = map(object({ new_name = optional(string), new_tag = optional(string) }))
  default     = {}

  validation {
    condition     = !contains(keys(var.images), "zeroserve-platform")
    error_message = "images: key the platform image as ghcr.io/zeroserve/platform; deploy/kubernetes renames zeroserve-platform before this override applies, so that key would change nothing."
  }
}

variable "node_cache_host_path" {
  description = "Host folder of the node-local model cache on GPU nodes (on the instance-store RAID0 that nodeadm mounts at /mnt/k8s-disks/0); created on every GPU node, owned by the runtime user (10001), and set as ZEROSERVE_KNATIVE_CACHE_HOST_PATH in place of the backend's default /mnt/zeroserve-cache."
  type        = string
  default     = "/mnt/k8s-disks/0/zeroserve-cache"

  validation {
    condition     = startswith(var.node_cache_host_path, "/")
    error_message = "node_cache_host_path must be an absolute path."
  }
}

variable "knative_serving_version" {
  description = "Knative Serving minor version the operator installs: 1.21 or later, the first whose autoscaler follows the min-scale the control plane patches on Revisions (its preflight refuses older releases)."
  type        = string
  default     = "1.21"

  validation {
    condition     = can(regex("^1\\.[0-9]+$", var.knative_serving_version)) && try(tonumber(split(".", var.knative_serving_version)[1]) >= 21, false)
    error_message = "knative_serving_version must look like 1.21, and be 1.21 or later."
  }
}

variable "max_revision_timeout_s" {
  description = "Knative's max-revision-timeout-seconds: the longest request (and activation) a runtime pool may take. At least the pools' timeoutSeconds (ZEROSERVE_KNATIVE_REVISION_TIMEOUT_S, 900 in deploy/kubernetes), or the control plane refuses to start."
  type        = number
  default     = 3600

  validation {
    condition     = var.max_revision_timeout_s >= 900 && var.max_revision_timeout_s <= 86400
    error_message = "max_revision_timeout_s must be between 900 (the runtime pools' timeoutSeconds in deploy/kubernetes) and 86400."
  }
}

variable "progress_deadline_s" {
  description = "Knative's progress-deadline: how long a new runtime pod may take (GPU node start, image pull, weights) before its revision fails."
  type        = number
  default     = 1800

  validation {
    condition     = var.progress_deadline_s >= 600
    error_message = "progress_deadline_s must be at least 600: GPU node provisioning alone can take minutes."
  }
}

variable "chart_versions" {
  description = "Pinned Helm chart versions of the add-ons."
  type = object({
    knative_operator             = string
    nvidia_device_plugin         = string
    cluster_autoscaler           = string
    kube_prometheus_stack        = string
    aws_load_balancer_controller = string
  })
  default = {
    knative_operator             = "v1.21.0"
    nvidia_device_plugin         = "0.17.1"
    cluster_autoscaler           = "9.46.6"
    kube_prometheus_stack        = "87.5.0"
    aws_load_balancer_controller = "1.13.4"
  }

  validation {
    condition     = alltrue([for version in values(var.chart_versions) : can(regex("^v?[0-9]+\\.[0-9]+\\.[0-9]+$", version))])
    error_message = "chart_versions must be exact versions (1.2.3 or v1.2.3): unpinned charts change under you."
  }
}

# ---- monitoring ----

variable "prometheus_retention" {
  description = "How long Prometheus keeps samples (Prometheus duration, e.g. 15d)."
  type        = string
  default     = "15d"

  validation {
    condition     = can(regex("^[0-9]+(h|d|w|y)$", var.prometheus_retention))
    error_message = "prometheus_retention must be a duration such as 15d."
  }
}

variable "prometheus_volume_gib" {
  description = "Size of Prometheus's EBS volume in GiB."
  type        = number
  default     = 50

  validation {
    condition     = var.prometheus_volume_gib >= 10
    error_message = "prometheus_volume_gib must be at least 10."
  }
}

variable "log_retention_days" {
  description = "Retention of the CloudWatch log groups (container logs, VPC flow logs, Redis slow log)."
  type        = number
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a retention CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, 60, 90, ..., 365, ...)."
  }
}

variable "alarm_email" {
  description = "E-mail address subscribed to the alarms' SNS topic (confirm the subscription mail); empty: no subscription."
  type        = string
  default     = ""

  validation {
    condition     = var.alarm_email == "" || can(regex("^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$", var.alarm_email))
    error_message = "alarm_email must be an e-mail address or empty."
  }
}

variable "alarm_thresholds" {
  description = "CloudWatch alarm thresholds: activation failures per 5 minutes, 5xx percentage of requests, p99 request latency (ms), p95 cold start (s), and the fewest requests per minute for the 5xx alarm to judge."
  type = object({
    activation_failures = optional(number, 0)
    error_5xx_percent   = optional(number, 5)
    p99_latency_ms      = optional(number, 5000)
    cold_start_p95_s    = optional(number, 120)
    min_requests        = optional(number, 20)
  })
  default = {}

  validation {
    condition = (
      var.alarm_thresholds.activation_failures >= 0
      && var.alarm_thresholds.error_5xx_percent > 0 && var.alarm_thresholds.error_5xx_percent <= 100
      && var.alarm_thresholds.p99_latency_ms > 0
      && var.alarm_thresholds.cold_start_p95_s > 0
      && var.alarm_thresholds.min_requests >= 1
    )
    error_message = "alarm_thresholds: failures >= 0, 0 < error_5xx_percent <= 100, latency and cold start > 0, min_requests >= 1."
  }
}
