"""A worker that stops answering (SIGSTOP) under traffic, through ``zeroserve up``.

A model has two replicas on two worker processes; one process is stopped. The activator
notices from its own traffic (requests waiting on that worker, no answer from it, a failed
liveness probe) and routes around it, long before the control plane's probes would condemn
it. The control plane is told to never condemn it here, so what the test sees is the
activator's doing alone. The requests sent to the stopped worker before that wait for it;
once the worker continues they are answered too, so every request ends in a 200.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_platform_e2e import (
    AUTH,
    SIZES,
    Platform,
    admin_get,
    assert_mlp_answer,
    eventually,
    infer,
    mlp_input,
    start_platform,
)
from tests.models import write_onnx_mlp

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

CLIENTS = 4
AFTER_SUSPENSION = 20
"""Requests answered through the other replica, while the worker is still stopped."""
WAIT_S = 120.0


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    started = start_platform(
        tmp_path,
        "stopped",
        # The control plane never kills the stopped worker here (its probes would, after
        # three failures): the rerouting seen is the activator's.
        ZEROSERVE_CONTROL_PLANE_WORKER_HEALTH_FAILURES="1000000",
    )
    try:
        yield started
    finally:
        started.stop()
        leftovers = started.wait_workers_gone()
        started.kill_leftovers()
        assert not leftovers, f"orphan workers {leftovers}"


async def _suspensions(client: httpx.AsyncClient, platform: Platform, model: str) -> float:
    text = (await client.get(f"{platform.public}/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "zeroserve_activator_replica_suspensions_total"
                and sample.labels.get("model") == model
            ):
                return float(sample.value)
    return 0.0


async def test_a_stopped_worker_is_routed_around_and_its_requests_wait_for_it(
    platform: Platform,
) -> None:
    model_dir = write_onnx_mlp(platform.models_dir, "pair", SIZES, seed=13)
    limits = httpx.Limits(max_connections=50, max_keepalive_connections=50)
    async with httpx.AsyncClient(timeout=WAIT_S, limits=limits) as client:
        body = {
            "name": "pair",
            "storage_uri": str(model_dir),
            "scaling": {"min_replicas": 2, "max_replicas": 2},
        }
        response = await client.post(f"{platform.admin}/admin/v1/models", json=body, headers=AUTH)
        assert response.status_code == 201, response.text
        workers: list[dict[str, Any]] = []

        async def two_replicas() -> bool:
            nonlocal workers
            workers = [
                w
                for w in (await admin_get(client, platform, "/workers"))["workers"]
                if "pair" in w["models"]
            ]
            return len(workers) == 2

        await eventually(two_replicas, "two replicas of the model", platform)
        platform.remember_workers()
        for seed in range(4):  # both replicas answer before anything stops
            x = mlp_input(seed)
            assert_mlp_answer(await infer(client, platform, "pair", x), model_dir, x)
        stopped = int(workers[0]["details"]["pid"])
        answered: list[int] = []
        failures: list[str] = []
        done = asyncio.Event()

        async def traffic(seed: int) -> None:
            i = 0
            while not done.is_set():
                i += 1
                x = mlp_input(seed * 100_000 + i)
                response = await infer(client, platform, "pair", x)
                try:
                    assert_mlp_answer(response, model_dir, x)
                    answered.append(seed)
                except AssertionError as exc:
                    failures.append(str(exc))

        os.kill(stopped, signal.SIGSTOP)
        try:
            tasks = [asyncio.create_task(traffic(seed)) for seed in range(CLIENTS)]

            async def suspended() -> bool:
                return await _suspensions(client, platform, "pair") >= 1

            await eventually(suspended, "the stopped worker to leave the routing", platform)
            # Requests keep being answered while the worker is still stopped: through the
            # other replica (the clients waiting on the stopped one are stuck until it runs).
            before = len(answered)

            async def others_answered() -> bool:
                return len(answered) >= before + AFTER_SUSPENSION

            await eventually(others_answered, "answers from the other replica", platform)
            assert failures == []
        finally:
            os.kill(stopped, signal.SIGCONT)
        done.set()
        # The requests that waited on the stopped worker are answered once it runs again.
        async with asyncio.timeout(WAIT_S):
            await asyncio.gather(*tasks)
        assert failures == []

        async def back_in_routing() -> bool:
            return "answers again; its replicas are back in routing" in platform.log()

        await eventually(back_in_routing, "the worker to come back into routing", platform)
