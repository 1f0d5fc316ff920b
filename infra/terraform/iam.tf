# IAM roles for service accounts (IRSA), one per workload, each with only what it uses:
#   runtime pods      read models under model_prefix (and decrypt them through S3, only)
#   control plane     publish its activation metrics to the zeroserve CloudWatch namespace
#   activator         publish its request metrics to the same namespace
#   add-ons           what their own documentation asks for
# No role can write the model bucket.

locals {
  irsa = {
    runtime            = { namespace = local.namespace, service_account = var.service_accounts.runtime }
    control_plane      = { namespace = local.namespace, service_account = var.service_accounts.control_plane }
    activator          = { namespace = local.namespace, service_account = var.service_accounts.activator }
    cluster_autoscaler = { namespace = "kube-system", service_account = "cluster-autoscaler" }
    ebs_csi            = { namespace = "kube-system", service_account = "ebs-csi-controller-sa" }
    cloudwatch_agent   = { namespace = "amazon-cloudwatch", service_account = "cloudwatch-agent" }
  }
}

data "aws_iam_policy_document" "irsa_trust" {
  for_each = local.irsa

  statement {
    actions = ["sts:AssumeRoleWithWebIdentity"]
    principals {
      type        = "Federated"
      identifiers = [module.eks.oidc_provider_arn]
    }
    condition {
      test     = "StringEquals"
      variable = "${local.oidc_issuer}:sub"
      values   = ["system:serviceaccount:${each.value.namespace}:${each.value.service_account}"]
    }
    condition {
      test     = "StringEquals"
      variable = "${local.oidc_issuer}:aud"
      values   = ["sts.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "irsa" {
  for_each = local.irsa

  name               = "${var.cluster_name}-${replace(each.key, "_", "-")}"
  description        = "IRSA role of ${each.value.namespace}/${each.value.service_account}"
  assume_role_policy = data.aws_iam_policy_document.irsa_trust[each.key].json
}

# ---- zeroserve ----

data "aws_iam_policy_document" "runtime" {
  statement {
    sid       = "ReadModels"
    actions   = ["s3:GetObject"]
    resources = ["${aws_s3_bucket.models.arn}/${var.model_prefix}*"]
  }

  statement {
    sid       = "ListModels"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.models.arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.model_prefix}*"]
    }
  }

  statement {
    sid       = "DecryptModelsThroughS3"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.models.arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.region}.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "runtime" {
  name   = "read-models"
  role   = aws_iam_role.irsa["runtime"].id
  policy = data.aws_iam_policy_document.runtime.json
}

data "aws_iam_policy_document" "publish_metrics" {
  statement {
    sid     = "PublishZeroserveMetrics"
    actions = ["cloudwatch:PutMetricData"]
    # PutMetricData has no resource-level permissions; the namespace condition is the bound.
    resources = ["*"]
    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = ["zeroserve"]
    }
  }
}

resource "aws_iam_role_policy" "control_plane" {
  name   = "publish-metrics"
  role   = aws_iam_role.irsa["control_plane"].id
  policy = data.aws_iam_policy_document.publish_metrics.json
}

# The admin API checks each registration against the stored model as a worker would read
# it (listings, config files, an ONNX file's first kilobytes), so it reads what workers read.
resource "aws_iam_role_policy" "control_plane_read_models" {
  name   = "read-models"
  role   = aws_iam_role.irsa["control_plane"].id
  policy = data.aws_iam_policy_document.runtime.json
}

resource "aws_iam_role_policy" "activator" {
  name   = "publish-metrics"
  role   = aws_iam_role.irsa["activator"].id
  policy = data.aws_iam_policy_document.publish_metrics.json
}

# ---- add-ons ----

data "aws_iam_policy_document" "cluster_autoscaler" {
  statement {
    sid = "Discover"
    actions = [
      "autoscaling:DescribeAutoScalingGroups",
      "autoscaling:DescribeAutoScalingInstances",
      "autoscaling:DescribeLaunchConfigurations",
      "autoscaling:DescribeScalingActivities",
      "autoscaling:DescribeTags",
      "ec2:DescribeImages",
      "ec2:DescribeInstanceTypes",
      "ec2:DescribeLaunchTemplateVersions",
      "ec2:GetInstanceTypesFromInstanceRequirements",
    ]
    # These calls have no resource-level permissions.
    resources = ["*"]
  }

  statement {
    sid       = "ReadOwnNodeGroups"
    actions   = ["eks:DescribeNodegroup"]
    resources = ["arn:${local.partition}:eks:${var.region}:${local.account_id}:nodegroup/${var.cluster_name}/*/*"]
  }

  statement {
    sid = "ScaleOwnNodeGroups"
    actions = [
      "autoscaling:SetDesiredCapacity",
      "autoscaling:TerminateInstanceInAutoScalingGroup",
    ]
    resources = ["arn:${local.partition}:autoscaling:${var.region}:${local.account_id}:autoScalingGroup:*"]
    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/k8s.io/cluster-autoscaler/${var.cluster_name}"
      values   = ["owned"]
    }
  }
}

resource "aws_iam_role_policy" "cluster_autoscaler" {
  name   = "cluster-autoscaler"
  role   = aws_iam_role.irsa["cluster_autoscaler"].id
  policy = data.aws_iam_policy_document.cluster_autoscaler.json
}

resource "aws_iam_role_policy_attachment" "ebs_csi" {
  role       = aws_iam_role.irsa["ebs_csi"].name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
}

resource "aws_iam_role_policy_attachment" "cloudwatch_agent" {
  role       = aws_iam_role.irsa["cloudwatch_agent"].name
  policy_arn = "arn:${local.partition}:iam::aws:policy/CloudWatchAgentServerPolicy"
}
