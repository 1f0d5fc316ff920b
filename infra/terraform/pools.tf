# The runtime pools' pod templates (ZEROSERVE_KNATIVE_POOLS), with requests computed from the
# GPU node group's instance types rather than written by hand: a pod that asks for more than
# a node's allocatable after EKS's reservations and the DaemonSets never schedules, and its
# pool stays at zero workers (modules/pod-requests says how it is computed).
#
#   gpu   runtime-cuda: ONNX Runtime and PyTorch models
#   vllm  runtime-vllm: LLMs on vLLM, whose engine core must start by spawn (a forked child
#         inherits the parent's CUDA state and fails to initialise CUDA), with a
#         memory-backed /dev/shm for its and NCCL's shared-memory buffers
#
# The control plane sends models registered with backend vllm to the vllm pool and the rest
# to gpu (ZEROSERVE_CONTROL_PLANE_POOL and _EXTRA_POOLS in deploy/kubernetes/config.yaml);
# a knative_pools given instead must hold templates for both names, or it refuses to start.

module "gpu_pod_requests" {
  source = "./modules/pod-requests"

  instance_types = var.gpu_instance_types
  gpus_per_pod   = 1
}

locals {
  gpu_pod_placement = {
    gpus          = 1
    node_selector = { (local.gpu_label.key) = local.gpu_label.value }
    tolerations   = [{ key = local.gpu_taint.key, operator = "Exists", effect = "NoSchedule" }]
  }

  knative_pools = {
    gpu = merge(local.gpu_pod_placement, {
      image  = var.runtime_images.cuda
      cpu    = module.gpu_pod_requests.cpu
      memory = module.gpu_pod_requests.memory
    })
    vllm = merge(local.gpu_pod_placement, {
      image    = var.runtime_images.vllm
      cpu      = module.gpu_pod_requests.cpu
      memory   = module.gpu_pod_requests.memory
      env      = { VLLM_WORKER_MULTIPROC_METHOD = "spawn" }
      shm_size = var.vllm_shm_size
    })
  }
}
