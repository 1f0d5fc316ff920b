"""One place to scrape in ``zeroserve up``: the admin port's ``/metrics`` carries every
worker's Triton families and the families its models define, labelled with model and
worker, next to the platform's own, and drops a worker's families once that worker has
stopped."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_platform_e2e import (
    SIZES,
    Platform,
    admin_get,
    assert_mlp_answer,
    eventually,
    infer,
    mlp_input,
    register,
    start_platform,
)
from tests.models import write_onnx_mlp, write_python_model

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

REQUEST_TIMEOUT_S = 90.0

COUNTING_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # Kept: as in Triton, a family no longer referenced is deleted with its metrics.
        self.family = pb_utils.MetricFamily(
            "rows_counted", "Rows seen", pb_utils.MetricFamily.COUNTER
        )
        self.rows = self.family.Metric(labels={"model": args["model_name"]})

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            self.rows.increment(len(x))
            out = pb_utils.Tensor("OUTPUT0", x)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""
"""A Triton-contract model with a counter of its own (a name no prefix list could know)."""


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    started = start_platform(tmp_path, "scraped")
    try:
        yield started
    finally:
        started.stop()
        leftovers = started.wait_workers_gone()
        started.kill_leftovers()
        assert not leftovers, f"orphan workers {leftovers}"


def _samples(page: str, family: str) -> dict[tuple[str, str], float]:
    """(worker, model) -> value of ``family``'s samples on ``page``, which must parse whole."""
    parsed = list(text_string_to_metric_families(page))
    return {
        (sample.labels["worker"], sample.labels["model"]): sample.value
        for metric in parsed
        if metric.name == family
        for sample in metric.samples
    }


async def test_admin_metrics_carry_the_workers_families_until_the_worker_stops(
    platform: Platform,
) -> None:
    model_dir = write_onnx_mlp(platform.models_dir, "scraped", SIZES, seed=5)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        await register(client, platform, model_dir)
        x = mlp_input(1)
        for _ in range(3):
            assert_mlp_answer(await infer(client, platform, "scraped", x), model_dir, x)

        [worker] = (await admin_get(client, platform, "/workers"))["workers"]
        page = (await client.get(f"{platform.admin}/metrics")).text
        # The platform's own families and the worker's, on one page.
        assert "zeroserve_activations_total" in page
        assert _samples(page, "nv_inference_request_success") == {(worker["id"], "scraped"): 3}
        # The worker's own families too (what the dashboard reads of model states).
        assert "zeroserve_model_state{" in page
        # The same counts as the worker's own page says.
        direct = (await client.get(f"{worker['url']}/metrics")).text
        assert 'nv_inference_request_success{model="scraped",version="1"} 3' in direct

        # A model's own family, from its stub process through its worker.
        counting = write_python_model(platform.models_dir, "counting", COUNTING_MODEL, dims=(4,))
        await register(client, platform, counting)
        answered = await infer(client, platform, "counting", np.full((2, 4), 0.5, np.float32))
        assert answered.status_code == 200, answered.text
        page = (await client.get(f"{platform.admin}/metrics")).text
        [counted] = [
            w
            for w in (await admin_get(client, platform, "/workers"))["workers"]
            if "counting" in w["models"]
        ]
        assert _samples(page, "rows_counted") == {(counted["id"], "counting"): 2}

        os.kill(int(worker["details"]["pid"]), signal.SIGKILL)

        async def dropped() -> bool:
            page = (await client.get(f"{platform.admin}/metrics")).text
            return f'worker="{worker["id"]}"' not in page and "zeroserve_workers" in page

        await eventually(dropped, "the stopped worker's families to leave /metrics", platform)
        page = (await client.get(f"{platform.admin}/metrics")).text
        assert _samples(page, "nv_inference_request_success") == {}
