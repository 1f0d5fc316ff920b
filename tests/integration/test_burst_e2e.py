"""Bursts at a scaled-to-zero model through ``zeroserve up``, on a machine kept busy.

Two rounds of 200 concurrent requests at the demo model, each from zero (the model idles
out and its worker stops in between), with two busy-loop processes competing for the CPU,
as when requests were seen lost. The second burst goes out on the first one's kept-alive
connections a few seconds later, when a server closing idle connections after uvicorn's
default 5 s would be closing them under the client's requests (seen as ``ReadError``).
Every request must be answered, and answered right: a connection closed without an answer,
a 5xx or a wrong output fails the test with every failure listed. ``bench/burst_loop.py``
repeats this test to count consecutive passes.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from data_plane.demo import DEMO_MODEL, DEMO_SEED, DEMO_WIDTHS, write_demo_repository
from data_plane.mlp import mlp_reference, mlp_weights
from tests.integration.test_platform_e2e import (
    AUTH,
    Platform,
    admin_get,
    eventually,
    start_platform,
)

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

BURST = 200
ROUNDS = 2
BUSY_LOOPS = 2
IDLE_TIMEOUT_S = 1.0
REQUEST_TIMEOUT_S = 180.0

_SPIN = """\
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""
"""A busy loop that ends with the test process, should that be killed before its teardown."""


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Two processes spinning on the CPU beside the platform, killed whatever happens."""
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(BUSY_LOOPS)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait(timeout=30)


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    started = start_platform(tmp_path, "burst")
    try:
        yield started
    finally:
        started.stop()
        leftovers = started.wait_workers_gone()
        started.kill_leftovers()
        assert not leftovers, f"orphan workers {leftovers}"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    # One client for both rounds, as a load generator keeps its connections: the second
    # burst reuses the first one's, some of them just as the server may be closing them.
    limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=BURST)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as http:
        yield http


def _demo_reference(x: np.ndarray) -> np.ndarray:
    return mlp_reference(mlp_weights(DEMO_WIDTHS, DEMO_SEED), x)


def _body(x: np.ndarray) -> dict[str, object]:
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": list(x.shape),
                "data": x.ravel().tolist(),
            }
        ]
    }


async def _scaled_to_zero(client: httpx.AsyncClient, platform: Platform) -> bool:
    status = (await admin_get(client, platform, f"/models/{DEMO_MODEL}"))["status"]
    workers = (await admin_get(client, platform, "/workers"))["workers"]
    return status["state"] == "scaled_to_zero" and not workers


async def test_bursts_from_zero_under_cpu_load_are_all_answered(
    cpu_load: None, platform: Platform, client: httpx.AsyncClient
) -> None:
    model_dir = write_demo_repository(platform.models_dir)
    body = {
        "name": DEMO_MODEL,
        "storage_uri": str(model_dir),
        "scaling": {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": IDLE_TIMEOUT_S},
    }
    response = await client.post(f"{platform.admin}/admin/v1/models", json=body, headers=AUTH)
    assert response.status_code == 201, response.text
    url = f"{platform.public}/v2/models/{DEMO_MODEL}/infer"
    rng = np.random.default_rng(10)
    failures: list[str] = []
    for round_ in range(ROUNDS):

        async def idle() -> bool:
            return await _scaled_to_zero(client, platform)

        await eventually(idle, f"the model to scale to zero before burst {round_ + 1}", platform)
        platform.remember_workers()
        inputs = [rng.standard_normal((1, 4), dtype=np.float32) for _ in range(BURST)]
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(client.post(url, json=_body(x)) for x in inputs), return_exceptions=True
        )
        elapsed_s = time.monotonic() - started
        kinds: collections.Counter[str] = collections.Counter()
        for i, (x, outcome) in enumerate(zip(inputs, outcomes, strict=True)):
            if isinstance(outcome, BaseException):
                kinds[type(outcome).__name__] += 1
                failures.append(f"burst {round_ + 1} request {i}: {outcome!r}")
                continue
            kinds[str(outcome.status_code)] += 1
            if outcome.status_code != 200:
                failures.append(
                    f"burst {round_ + 1} request {i}: {outcome.status_code} {outcome.text}"
                )
                continue
            output = outcome.json()["outputs"][0]
            got = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
            np.testing.assert_allclose(got, _demo_reference(x), rtol=1e-4, atol=1e-5)
        print(f"burst {round_ + 1}: {dict(kinds)} in {elapsed_s:.1f} s")
        platform.remember_workers()
    log_tail = platform.log()[-8000:]
    assert failures == [], "\n".join(failures) + f"\n--- platform log ---\n{log_tail}"
    timelines = (await admin_get(client, platform, f"/models/{DEMO_MODEL}/activations"))[
        "activations"
    ]
    # Each burst started from zero; under load the client sends a burst over seconds, so
    # the model may idle out and be revived mid-burst too (still nothing lost).
    assert len(timelines) >= ROUNDS
    assert platform.stop(signal.SIGTERM) == 0
