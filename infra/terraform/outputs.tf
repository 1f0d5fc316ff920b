output "cluster_name" {
  description = "Name of the EKS cluster."
  value       = module.eks.cluster_name
}

output "cluster_endpoint" {
  description = "The EKS API server endpoint."
  value       = module.eks.cluster_endpoint
}

output "kubeconfig_command" {
  description = "Command that adds the cluster to your kubeconfig."
  value       = "aws eks update-kubeconfig --name ${module.eks.cluster_name} --region ${var.region}"
}

output "model_bucket" {
  description = "S3 bucket for model weights."
  value       = aws_s3_bucket.models.bucket
}

output "model_storage_root" {
  description = "Where to upload models and what storage_uri values must start with."
  value       = "s3://${aws_s3_bucket.models.bucket}/${var.model_prefix}"
}

output "grpc_endpoint" {
  description = "The activator's gRPC endpoint for clients inside the cluster (Triton's inference service for every model); empty when serve_grpc is false. The public ALB carries HTTP only."
  value       = var.serve_grpc ? "zeroserve-activator.zeroserve.svc.cluster.local:8001" : ""
}

output "redis_primary_endpoint" {
  description = "Primary endpoint of the Redis state store (TLS, auth token; private subnets only)."
  value       = "${aws_elasticache_replication_group.state.primary_endpoint_address}:${aws_elasticache_replication_group.state.port}"
}

output "redis_url" {
  description = "The state store URL zeroserve uses (contains the auth token)."
  value       = local.redis_url
  sensitive   = true
}

output "admin_token" {
  description = "Bearer token of zeroserve's admin API."
  value       = random_password.admin_token.result
  sensitive   = true
}

output "grafana_admin_password" {
  description = "Password of Grafana's admin user."
  value       = random_password.grafana_admin.result
  sensitive   = true
}

output "iam_role_arns" {
  description = "IRSA role of each workload (runtime, control_plane, activator, and the add-ons)."
  value       = { for name, role in aws_iam_role.irsa : name => role.arn }
}

output "gpu_node_selector" {
  description = "Node selector of GPU runtime pools."
  value       = { (local.gpu_label.key) = local.gpu_label.value }
}

output "gpu_toleration" {
  description = "Toleration GPU runtime pools need."
  value       = { key = local.gpu_taint.key, operator = "Exists", effect = "NoSchedule" }
}

output "node_cache_host_path" {
  description = "Host folder for the node-local model cache on GPU nodes (local NVMe)."
  value       = var.node_cache_host_path
}

output "cloudwatch_namespace" {
  description = "CloudWatch namespace of zeroserve's own metrics (what the alarms watch)."
  value       = "zeroserve"
}

output "alarm_topic_arn" {
  description = "SNS topic the CloudWatch alarms notify."
  value       = aws_sns_topic.alarms.arn
}

output "grafana_command" {
  description = "Command that makes Grafana reachable on http://localhost:3000."
  value       = "kubectl -n monitoring port-forward svc/kube-prometheus-stack-grafana 3000:80"
}
