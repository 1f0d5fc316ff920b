module "vpc" {
  #checkov:skip=CKV_TF_1:Registry modules are pinned to an exact released version; the registry does not serve commit hashes.
  source  = "terraform-aws-modules/vpc/aws"
  version = "6.6.0"

  name = var.cluster_name
  cidr = var.vpc_cidr
  azs  = local.azs

  # /20 per zone for pods and nodes (the VPC CNI gives every pod a VPC address), /24 public.
  private_subnets = [for i, _ in local.azs : cidrsubnet(var.vpc_cidr, 4, i)]
  public_subnets  = [for i, _ in local.azs : cidrsubnet(var.vpc_cidr, 8, 200 + i)]

  enable_nat_gateway     = true
  single_nat_gateway     = var.single_nat_gateway
  one_nat_gateway_per_az = !var.single_nat_gateway
  enable_dns_hostnames   = true
  enable_dns_support     = true

  # Nothing gets a public address by being launched in a public subnet: only load balancers
  # and NAT gateways live there.
  map_public_ip_on_launch = false

  # The default security group allows nothing.
  manage_default_security_group  = true
  default_security_group_ingress = []
  default_security_group_egress  = []

  enable_flow_log                                 = true
  create_flow_log_cloudwatch_log_group            = true
  create_flow_log_cloudwatch_iam_role             = true
  flow_log_max_aggregation_interval               = 60
  flow_log_cloudwatch_log_group_retention_in_days = var.log_retention_days
  flow_log_cloudwatch_log_group_kms_key_id        = aws_kms_key.platform.arn

  public_subnet_tags = {
    "kubernetes.io/role/elb" = 1
  }
  private_subnet_tags = {
    "kubernetes.io/role/internal-elb" = 1
  }
}
