# Two customer-managed keys: one for model weights (runtime pods may decrypt through S3), one
# for the platform's own data (Redis, CloudWatch logs, the alarm topic). Neither grants
# anything to the cluster beyond what iam.tf says.

data "aws_iam_policy_document" "models_key" {
  #checkov:skip=CKV_AWS_109:A key policy's "*" resource is this key only; the account-root statement is AWS's default key policy, which hands access control to IAM.
  #checkov:skip=CKV_AWS_111:A key policy's "*" resource is this key only; the account-root statement is AWS's default key policy, which hands access control to IAM.
  #checkov:skip=CKV_AWS_356:A key policy's "*" resource is this key only; the account-root statement is AWS's default key policy, which hands access control to IAM.
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account_id}:root"]
    }
  }
}

resource "aws_kms_key" "models" {
  description             = "${var.cluster_name}: model weights in S3"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.models_key.json
}

resource "aws_kms_alias" "models" {
  name          = "alias/${var.cluster_name}-models"
  target_key_id = aws_kms_key.models.key_id
}

data "aws_iam_policy_document" "platform_key" {
  #checkov:skip=CKV_AWS_109:A key policy's "*" resource is this key only; the account-root statement is AWS's default key policy, which hands access control to IAM.
  #checkov:skip=CKV_AWS_111:A key policy's "*" resource is this key only; the account-root statement is AWS's default key policy, which hands access control to IAM.
  #checkov:skip=CKV_AWS_356:A key policy's "*" resource is this key only; the account-root statement is AWS's default key policy, which hands access control to IAM.
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account_id}:root"]
    }
  }

  statement {
    sid = "CloudWatchLogsEncrypts"
    actions = [
      "kms:Encrypt*",
      "kms:Decrypt*",
      "kms:ReEncrypt*",
      "kms:GenerateDataKey*",
      "kms:Describe*",
    ]
    resources = ["*"]
    principals {
      type        = "Service"
      identifiers = ["logs.${var.region}.amazonaws.com"]
    }
    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${local.partition}:logs:${var.region}:${local.account_id}:log-group:*"]
    }
  }

  # Alarms publish to an encrypted SNS topic.
  statement {
    sid       = "CloudWatchAlarmsPublish"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey*"]
    resources = ["*"]
    principals {
      type        = "Service"
      identifiers = ["cloudwatch.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

resource "aws_kms_key" "platform" {
  description             = "${var.cluster_name}: Redis state store, CloudWatch logs, alarm topic"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.platform_key.json
}

resource "aws_kms_alias" "platform" {
  name          = "alias/${var.cluster_name}-platform"
  target_key_id = aws_kms_key.platform.key_id
}
