# CloudWatch: the log groups the observability add-on writes to (created here first, with a
# retention and a KMS key), an encrypted SNS topic, and alarms on the metrics zeroserve
# publishes itself (foundation/cloudwatch.py: namespace "zeroserve", no dimensions).
# tests/infra/test_terraform.py checks that every alarm names a metric the code publishes.

resource "aws_cloudwatch_log_group" "container_insights" {
  for_each = toset(["application", "dataplane", "host", "performance"])

  name              = "/aws/containerinsights/${var.cluster_name}/${each.key}"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.platform.arn
}

resource "aws_sns_topic" "alarms" {
  name              = "${var.cluster_name}-alarms"
  kms_master_key_id = aws_kms_key.platform.arn
}

resource "aws_sns_topic_subscription" "alarm_email" {
  count = var.alarm_email != "" ? 1 : 0

  topic_arn = aws_sns_topic.alarms.arn
  protocol  = "email"
  endpoint  = var.alarm_email
}

resource "aws_cloudwatch_metric_alarm" "activation_failures" {
  alarm_name        = "${var.cluster_name}-activation-failures"
  alarm_description = "zeroserve cold starts failed; the requests that waited for them were answered 503. GET /admin/v1/models/NAME/activations shows why."

  namespace   = "zeroserve"
  metric_name = "ActivationFailures"
  statistic   = "Sum"
  period      = 300

  comparison_operator = "GreaterThanThreshold"
  threshold           = var.alarm_thresholds.activation_failures
  evaluation_periods  = 1
  treat_missing_data  = "notBreaching"

  alarm_actions = [aws_sns_topic.alarms.arn]
  ok_actions    = [aws_sns_topic.alarms.arn]
}

resource "aws_cloudwatch_metric_alarm" "error_5xx_rate" {
  alarm_name        = "${var.cluster_name}-5xx-rate"
  alarm_description = "More than ${var.alarm_thresholds.error_5xx_percent}% of model requests answered 5xx at the activator, in 3 of 5 minutes with at least ${var.alarm_thresholds.min_requests} requests."

  comparison_operator = "GreaterThanThreshold"
  threshold           = var.alarm_thresholds.error_5xx_percent
  evaluation_periods  = 5
  datapoints_to_alarm = 3
  treat_missing_data  = "notBreaching"

  metric_query {
    id = "errors"
    metric {
      namespace   = "zeroserve"
      metric_name = "Requests5xx"
      period      = 60
      stat        = "Sum"
    }
  }

  metric_query {
    id = "requests"
    metric {
      namespace   = "zeroserve"
      metric_name = "Requests"
      period      = 60
      stat        = "Sum"
    }
  }

  metric_query {
    id          = "percent"
    label       = "5xx answers (%)"
    expression  = "IF(requests >= ${var.alarm_thresholds.min_requests}, 100 * errors / requests, 0)"
    return_data = true
  }

  alarm_actions = [aws_sns_topic.alarms.arn]
  ok_actions    = [aws_sns_topic.alarms.arn]
}

resource "aws_cloudwatch_metric_alarm" "p99_latency" {
  alarm_name        = "${var.cluster_name}-p99-latency"
  alarm_description = "p99 model request latency at the activator above ${var.alarm_thresholds.p99_latency_ms} ms for 15 minutes (buffered time during cold starts included)."

  namespace          = "zeroserve"
  metric_name        = "RequestLatency"
  extended_statistic = "p99"
  unit               = "Milliseconds"
  period             = 300

  comparison_operator = "GreaterThanThreshold"
  threshold           = var.alarm_thresholds.p99_latency_ms
  evaluation_periods  = 3
  treat_missing_data  = "notBreaching"

  alarm_actions = [aws_sns_topic.alarms.arn]
  ok_actions    = [aws_sns_topic.alarms.arn]
}

resource "aws_cloudwatch_metric_alarm" "cold_start_time" {
  alarm_name        = "${var.cluster_name}-cold-start-time"
  alarm_description = "p95 cold start (activation queued to ready) above ${var.alarm_thresholds.cold_start_p95_s} s over 15 minutes; the activation timelines show which phase is slow."

  namespace          = "zeroserve"
  metric_name        = "ActivationDuration"
  extended_statistic = "p95"
  unit               = "Seconds"
  period             = 900

  comparison_operator = "GreaterThanThreshold"
  threshold           = var.alarm_thresholds.cold_start_p95_s
  evaluation_periods  = 1
  treat_missing_data  = "notBreaching"

  alarm_actions = [aws_sns_topic.alarms.arn]
  ok_actions    = [aws_sns_topic.alarms.arn]
}
