# The model bucket: SSE-KMS, versioned, never public, TLS only. Runtime pods read models
# under model_prefix (iam.tf); nothing in the cluster can write. When model_writer_arns is
# set, the bucket policy also denies writes by every other principal.

resource "aws_s3_bucket" "models" {
  #checkov:skip=CKV_AWS_18:Access logs need a second bucket per cluster; object reads are attributable through CloudTrail data events where an account enables them.
  #checkov:skip=CKV_AWS_144:Models are build artifacts that can be uploaded again; versioning protects against deletes, and cross-region replication would double the storage bill.
  #checkov:skip=CKV2_AWS_62:Nothing reacts to uploads: models are registered through the admin API, not by S3 events.
  bucket = local.model_bucket
}

resource "aws_s3_bucket_ownership_controls" "models" {
  bucket = aws_s3_bucket.models.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "models" {
  bucket                  = aws_s3_bucket.models.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "models" {
  bucket = aws_s3_bucket.models.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "models" {
  bucket = aws_s3_bucket.models.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.models.arn
    }
    # One KMS call per object instead of one per request: cold starts read many ranges.
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "models" {
  bucket = aws_s3_bucket.models.id

  rule {
    id     = "expire-replaced-model-versions"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_model_version_days
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }

  depends_on = [aws_s3_bucket_versioning.models]
}

data "aws_iam_policy_document" "models_bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.models.arn,
      "${aws_s3_bucket.models.arn}/*",
    ]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  dynamic "statement" {
    for_each = length(var.model_writer_arns) > 0 ? [1] : []
    content {
      sid    = "DenyWritesExceptModelWriters"
      effect = "Deny"
      actions = [
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:DeleteObjectVersion",
        "s3:RestoreObject",
      ]
      resources = ["${aws_s3_bucket.models.arn}/*"]
      principals {
        type        = "*"
        identifiers = ["*"]
      }
      condition {
        test     = "ArnNotLike"
        variable = "aws:PrincipalArn"
        values   = var.model_writer_arns
      }
    }
  }
}

resource "aws_s3_bucket_policy" "models" {
  bucket = aws_s3_bucket.models.id
  policy = data.aws_iam_policy_document.models_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.models]
}
