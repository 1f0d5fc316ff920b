"""The monitoring files against a running ``zeroserve up``: every metric the Grafana
dashboard and the Prometheus alert rules query is exported by some component's
``/metrics`` after real traffic (a cold start from S3, warm requests, a failed activation),
and the CloudWatch metrics the Terraform alarms watch arrive at moto's CloudWatch.

One platform serves the whole test: the control plane's ``/metrics`` on the admin port,
the activator's on the public port, and each worker's data plane on its own port.
"""

from __future__ import annotations

import asyncio
import datetime
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from data_plane.gpu_metrics import GpuMetrics
from foundation.cloudwatch import METRIC_NAMES, NAMESPACE
from tests.data_plane.storage.s3_server import CREDENTIALS, REGION, MotoServer, start_moto
from tests.integration.test_platform_e2e import (
    AUTH,
    SIZES,
    admin_get,
    assert_mlp_answer,
    infer,
    mlp_input,
    start_platform,
)
from tests.models import write_onnx_mlp
from tests.monitoring.queries import (
    CLUSTER_METRICS,
    dashboard_queries,
    exported_names,
    load_dashboard,
    load_rules,
    metric_names,
    rule_queries,
)
from tests.nvml_fake import fake_nvml

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

WAIT_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 90.0


@pytest.fixture
def moto(tmp_path: Path) -> Iterator[MotoServer]:
    server = start_moto(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def _gpu_only_names() -> set[str]:
    """What workers export only where NVML sees a GPU (none here): rendered with a fake NVML,
    so the names still come from the code that exports them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "pynvml", fake_nvml())
        return exported_names("\n".join(GpuMetrics().lines()))


def _cloudwatch_names(cloudwatch: Any) -> set[str]:
    pages = cloudwatch.get_paginator("list_metrics").paginate(Namespace=NAMESPACE)
    return {metric["MetricName"] for page in pages for metric in page["Metrics"]}


def _sum(cloudwatch: Any, name: str) -> float:
    now = datetime.datetime.now(datetime.UTC)
    points = cloudwatch.get_metric_statistics(
        Namespace=NAMESPACE,
        MetricName=name,
        StartTime=now - datetime.timedelta(hours=1),
        EndTime=now + datetime.timedelta(minutes=5),
        Period=3600,
        Statistics=["Sum"],
    )["Datapoints"]
    return float(sum(point["Sum"] for point in points))


async def test_everything_the_dashboard_and_alerts_query_is_exported(
    moto: MotoServer, tmp_path: Path
) -> None:
    bucket = f"models-{uuid.uuid4().hex[:12]}"
    s3 = moto.client()
    s3.create_bucket(Bucket=bucket)
    model_dir = write_onnx_mlp(tmp_path / "local", "watched", SIZES, seed=3)
    for prefix in ("repo/watched", "repo/broken"):
        for path in model_dir.rglob("*"):
            if path.is_file() and path.name != "weights.npz":
                key = f"{prefix}/{path.relative_to(model_dir).as_posix()}"
                s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    platform = start_platform(
        tmp_path,
        "monitored",
        AWS_ENDPOINT_URL=moto.url,
        AWS_ACCESS_KEY_ID=CREDENTIALS["aws_access_key_id"],
        AWS_SECRET_ACCESS_KEY=CREDENTIALS["aws_secret_access_key"],
        AWS_DEFAULT_REGION=REGION,
        # botocore gzips large PutMetricData bodies and moto_server (5.2) cannot read them.
        AWS_DISABLE_REQUEST_COMPRESSION="true",
        ZEROSERVE_ALLOWED_STORAGE=f"s3://{bucket}",
        ZEROSERVE_CONTROL_PLANE_CLOUDWATCH_ENABLED="true",
        ZEROSERVE_CONTROL_PLANE_CLOUDWATCH_FLUSH_INTERVAL_S="0.2",
        ZEROSERVE_ACTIVATOR_CLOUDWATCH_ENABLED="true",
        ZEROSERVE_ACTIVATOR_CLOUDWATCH_FLUSH_INTERVAL_S="0.2",
        ZEROSERVE_ACTIVATOR_ACTIVATION_TIMEOUT_S="30",
    )
    try:
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
            for name, prefix in (("watched", "repo/watched"), ("broken", "repo/broken")):
                body = {
                    "name": name,
                    "storage_uri": f"s3://{bucket}/{prefix}",
                    "scaling": {"min_replicas": 0},
                }
                created = await client.post(
                    f"{platform.admin}/admin/v1/models", json=body, headers=AUTH
                )
                assert created.status_code == 201, created.text

            # A cold start with a burst behind it (buffered), then warm requests.
            x = mlp_input(3)
            answers = await asyncio.gather(
                *(infer(client, platform, "watched", x) for _ in range(4))
            )
            for answer in (*answers, await infer(client, platform, "watched", x)):
                assert_mlp_answer(answer, model_dir, x)
            # An activation that fails: the model's storage emptied after it registered,
            # which fails for good (424, not retried) rather than for a passing reason.
            listed = s3.list_objects_v2(Bucket=bucket, Prefix="repo/broken/")
            for item in listed["Contents"]:
                s3.delete_object(Bucket=bucket, Key=item["Key"])
            failed = await infer(client, platform, "broken", x)
            assert failed.status_code == 424, failed.text

            workers = (await admin_get(client, platform, "/workers"))["workers"]
            assert workers
            pages = {
                "control plane": (await client.get(f"{platform.admin}/metrics")).text,
                "activator": (await client.get(f"{platform.public}/metrics")).text,
            }
            for worker in workers:
                pages[f"worker {worker['id']}"] = (
                    await client.get(f"{worker['url']}/metrics")
                ).text

        exported = set().union(*(exported_names(page) for page in pages.values()))
        gpu_only = _gpu_only_names()
        assert gpu_only == {
            "nv_gpu_utilization",
            "nv_gpu_memory_total_bytes",
            "nv_gpu_memory_used_bytes",
            "nv_gpu_power_usage",
            "nv_gpu_power_limit",
        }
        for source, queries in (
            ("dashboard", dashboard_queries(load_dashboard())),
            ("alert rules", rule_queries(load_rules())),
        ):
            queried = set().union(*(metric_names(query) for query in queries))
            missing = queried - exported - gpu_only - CLUSTER_METRICS
            assert not missing, f"the {source} queries metrics nobody exports: {sorted(missing)}"

        # The traffic above left real samples, not only declarations, where it should.
        samples = "\n".join(pages.values())
        for line in (
            'zeroserve_activations_total{outcome="ready",trigger="request"}',
            'zeroserve_activations_total{outcome="failed",trigger="request"}',
            'zeroserve_activator_requests_total{code="200",model="watched"} 5.0',
            'zeroserve_activator_requests_total{code="424",model="broken"} 1.0',
            'zeroserve_model_state{model="watched",state="ready",version="1"} 1',
            "zeroserve_cache_misses_total 1.0",
        ):
            assert line in samples, line

        cloudwatch = boto3.client(
            "cloudwatch", endpoint_url=moto.url, region_name=REGION, **CREDENTIALS
        )

        def arrived() -> bool:
            return (
                _cloudwatch_names(cloudwatch) == METRIC_NAMES
                and _sum(cloudwatch, "Requests") >= 6
                and _sum(cloudwatch, "Requests5xx") == 0
                and _sum(cloudwatch, "ActivationFailures") >= 1
            )

        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while not arrived():
            assert time.monotonic() < deadline, "CloudWatch did not get the metrics in time"
            await asyncio.sleep(0.2)
    finally:
        platform.stop()
        leftovers = platform.wait_workers_gone()
        platform.kill_leftovers()
        assert not leftovers, f"orphan workers {leftovers}"
