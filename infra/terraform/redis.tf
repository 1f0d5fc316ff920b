# The state store: Redis with TLS and an auth token, in private subnets, reachable only
# from the cluster's nodes, Multi-AZ with automatic failover.

resource "random_password" "redis_auth" {
  length = 48
  # ElastiCache refuses @, " and / in auth tokens; letters and digits are enough at 48.
  special = false
}

resource "aws_elasticache_subnet_group" "state" {
  name        = "${var.cluster_name}-state"
  description = "Private subnets of the zeroserve state store"
  subnet_ids  = module.vpc.private_subnets
}

resource "aws_security_group" "redis" {
  name        = "${var.cluster_name}-redis"
  description = "zeroserve state store: Redis from the cluster's nodes only"
  vpc_id      = module.vpc.vpc_id
}

resource "aws_vpc_security_group_ingress_rule" "redis_from_nodes" {
  security_group_id            = aws_security_group.redis.id
  description                  = "Redis (TLS) from EKS nodes and pods"
  ip_protocol                  = "tcp"
  from_port                    = 6379
  to_port                      = 6379
  referenced_security_group_id = module.eks.node_security_group_id
}

resource "aws_cloudwatch_log_group" "redis_slow_log" {
  name              = "/aws/elasticache/${var.cluster_name}-state/slow-log"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.platform.arn
}

resource "aws_elasticache_replication_group" "state" {
  replication_group_id = "${var.cluster_name}-state"
  description          = "zeroserve state store (registry, placements, leases)"
  engine               = "redis"
  engine_version       = var.redis_engine_version
  node_type            = var.redis_node_type
  port                 = 6379
  parameter_group_name = "default.redis${split(".", var.redis_engine_version)[0]}"

  num_cache_clusters         = 2
  automatic_failover_enabled = true
  multi_az_enabled           = true

  subnet_group_name  = aws_elasticache_subnet_group.state.name
  security_group_ids = [aws_security_group.redis.id]

  at_rest_encryption_enabled = true
  kms_key_id                 = aws_kms_key.platform.arn
  transit_encryption_enabled = true
  transit_encryption_mode    = "required"
  auth_token                 = random_password.redis_auth.result
  auth_token_update_strategy = "ROTATE"

  snapshot_retention_limit   = 7
  snapshot_window            = "03:00-04:00"
  maintenance_window         = "sun:05:00-sun:06:00"
  auto_minor_version_upgrade = true

  log_delivery_configuration {
    destination      = aws_cloudwatch_log_group.redis_slow_log.name
    destination_type = "cloudwatch-logs"
    log_format       = "json"
    log_type         = "slow-log"
  }
}
