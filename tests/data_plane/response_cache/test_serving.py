"""The response cache on the infer path, in process over HTTP and gRPC: a hit answers
without the model or its batcher, misses fill the cache up to its bound and the least
recently used answers go, statistics and metrics as Triton reports them, and configs
Triton refuses a cache for are refused at load."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import json_format

from data_plane.inference import infer
from data_plane.protocol import InferInput, InferRequest
from data_plane.response_cache.cache import entry_size
from foundation.proto import grpc_service_pb2 as pb, model_config_pb2 as mc
from tests.data_plane.response_cache.serving import CachedDataPlane, cached_data_plane
from tests.models import make_config, read_config, write_config, write_python_model
from tests.triton_oracle import write_python_backend_model

pytestmark = pytest.mark.anyio

WAIT_S = 30.0

COUNTER_MODEL = """\
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0
        self.lock = threading.Lock()

    def execute(self, inputs):
        x = inputs["INPUT0"]
        if (x < 0).any():
            # Holds the model's only instance until the test lets it go.
            deadline = time.monotonic() + 30
            while not Path({release!r}).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        with self.lock:
            self.calls += 1
            calls = self.calls
        return {{"OUTPUT0": x * 2, "CALLS": np.full_like(x, calls)}}
"""
"""``OUTPUT0 = INPUT0 * 2`` and ``CALLS``: how many times the model ran, this run included."""

TRITON_FORM_MODEL = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.calls += 1
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            scale = json.loads(request.parameters()).get("scale", 1)
            outputs = [
                pb_utils.Tensor("OUTPUT0", (x * scale).astype(np.float32)),
                pb_utils.Tensor("CALLS", np.full_like(x, self.calls)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""
"""Triton's form, given each request's parameters: ``OUTPUT0 = INPUT0 * scale``."""


def _write_counter(repo: Path, name: str, *, cache: bool) -> Path:
    source = COUNTER_MODEL.format(release=str(repo / "release"))
    model_dir = write_python_model(repo, name, source, outputs=("OUTPUT0", "CALLS"))
    config = read_config(model_dir)
    config.response_cache.enable = cache
    write_config(model_dir, config)
    return model_dir


def _body(values: Sequence[float], **parameters: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, len(values)], "data": values}
        ]
    }
    if parameters:
        body["parameters"] = parameters
    return body


async def _infer(plane: CachedDataPlane, model: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await plane.client.post(f"/v2/models/{model}/infer", json=body)
    assert response.status_code == 200, response.text
    return {o["name"]: o["data"] for o in response.json()["outputs"]}


async def _inference_stats(plane: CachedDataPlane, model: str) -> dict[str, Any]:
    response = await plane.client.get(f"/v2/models/{model}/stats")
    assert response.status_code == 200
    stats: dict[str, Any] = response.json()["model_stats"][0]
    return stats


def _metrics(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line.startswith("nv_cache"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    _write_counter(repo, "cached", cache=True)
    _write_counter(repo, "plain", cache=False)
    return repo


async def test_a_hit_answers_without_running_the_model(repo: Path, tmp_path: Path) -> None:
    async with cached_data_plane(
        repo, tmp_path / "cache", response_cache_bytes=1 << 20, load_models=("cached",)
    ) as plane:
        first = await _infer(plane, "cached", _body([1, 2, 3, 4]))
        assert first == {"OUTPUT0": [2, 4, 6, 8], "CALLS": [1, 1, 1, 1]}
        assert await _infer(plane, "cached", _body([1, 2, 3, 4])) == first
        assert await _infer(plane, "cached", _body([1, 2, 3, 4])) == first
        other = await _infer(plane, "cached", _body([1, 2, 3, 5]))
        assert other["CALLS"] == [2, 2, 2, 2]
        # The same values in another shape are another request.
        square = {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]}
            ]
        }
        assert (await _infer(plane, "cached", square))["CALLS"] == [3, 3, 3, 3]
        # Which outputs a request asks for is picked from the cached answer.
        only = await _infer(
            plane, "cached", {**_body([1, 2, 3, 4]), "outputs": [{"name": "CALLS"}]}
        )
        assert only == {"CALLS": [1, 1, 1, 1]}

        stats = await _inference_stats(plane, "cached")
        inference = stats["inference_stats"]
        assert stats["execution_count"] == 3
        assert stats["inference_count"] == 1 + 1 + 2
        assert inference["success"]["count"] == 6
        assert inference["queue"]["count"] == 6
        assert inference["compute_infer"]["count"] == 3
        assert inference["cache_hit"]["count"] == 3
        assert inference["cache_miss"]["count"] == 3
        assert inference["cache_hit"]["ns"] > 0 and inference["cache_miss"]["ns"] > 0


async def test_a_hit_does_not_wait_for_the_busy_model(repo: Path, tmp_path: Path) -> None:
    """The model's one instance is held by a request; a cached answer still comes back,
    which it could not if it were queued behind that request in the batcher."""
    async with cached_data_plane(
        repo, tmp_path / "cache", response_cache_bytes=1 << 20, load_models=("cached",)
    ) as plane:
        cached = await _infer(plane, "cached", _body([1, 2]))
        held = asyncio.create_task(_infer(plane, "cached", _body([-1, -2])))
        batcher = plane.repository.get("cached").batcher
        deadline = time.monotonic() + WAIT_S
        # The batcher offers nothing to wait on for an execution to begin: poll, bounded.
        while batcher.executing_count == 0 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        assert batcher.executing_count == 1
        try:
            assert await asyncio.wait_for(_infer(plane, "cached", _body([1, 2])), WAIT_S) == cached
            assert not held.done()
        finally:
            (repo / "release").write_text("go")
        assert (await asyncio.wait_for(held, WAIT_S))["CALLS"] == [2, 2]


async def test_least_recently_used_answers_go_under_the_bound(repo: Path, tmp_path: Path) -> None:
    answer = {
        "OUTPUT0": np.zeros((1, 4), dtype=np.float32),
        "CALLS": np.zeros((1, 4), dtype=np.float32),
    }
    size = entry_size(b"k" * 32, answer)
    async with cached_data_plane(
        repo, tmp_path / "cache", response_cache_bytes=2 * size, load_models=("cached",)
    ) as plane:
        assert (await _infer(plane, "cached", _body([1, 1, 1, 1])))["CALLS"][0] == 1
        assert (await _infer(plane, "cached", _body([2, 2, 2, 2])))["CALLS"][0] == 2
        assert (await _infer(plane, "cached", _body([1, 1, 1, 1])))["CALLS"][0] == 1  # hit
        # A third answer evicts the least recently used: [2, ...].
        assert (await _infer(plane, "cached", _body([3, 3, 3, 3])))["CALLS"][0] == 3
        assert (await _infer(plane, "cached", _body([1, 1, 1, 1])))["CALLS"][0] == 1
        assert (await _infer(plane, "cached", _body([2, 2, 2, 2])))["CALLS"][0] == 4
        assert plane.response_cache is not None
        snapshot = plane.response_cache.snapshot()
        assert (snapshot.entries, snapshot.evictions) == (2, 2)
        assert snapshot.used_bytes == 2 * size
        metrics = _metrics((await plane.client.get("/metrics")).text)
        assert metrics["nv_cache_num_entries"] == 2
        assert metrics["nv_cache_num_evictions"] == 2
        assert metrics["nv_cache_util"] == 1.0


async def test_an_answer_larger_than_the_cache_is_not_cached(repo: Path, tmp_path: Path) -> None:
    async with cached_data_plane(
        repo, tmp_path / "cache", response_cache_bytes=256, load_models=("cached",)
    ) as plane:
        wide = [1.0] * 64  # two outputs of 256 bytes each
        assert (await _infer(plane, "cached", _body(wide)))["CALLS"][0] == 1
        assert (await _infer(plane, "cached", _body(wide)))["CALLS"][0] == 2
        small = await _infer(plane, "cached", _body([1.0]))
        assert await _infer(plane, "cached", _body([1.0])) == small
        inference = (await _inference_stats(plane, "cached"))["inference_stats"]
        assert (inference["cache_miss"]["count"], inference["cache_hit"]["count"]) == (3, 1)
        assert plane.response_cache is not None
        assert plane.response_cache.snapshot().entries == 1


async def test_metrics_and_statistics_over_http_and_grpc(repo: Path, tmp_path: Path) -> None:
    async with cached_data_plane(
        repo, tmp_path / "cache", response_cache_bytes=1 << 20, load_models=("cached", "plain")
    ) as plane:
        for values in ([1, 2], [1, 2], [1, 2], [3, 4]):
            await _infer(plane, "cached", _body(values))
            await _infer(plane, "plain", _body(values))
        text = (await plane.client.get("/metrics")).text
        metrics = _metrics(text)
        labels = '{model="cached",version="1"}'
        assert metrics[f"nv_cache_num_hits_per_model{labels}"] == 2
        assert metrics[f"nv_cache_num_misses_per_model{labels}"] == 2
        assert metrics[f"nv_cache_hit_duration_per_model{labels}"] >= 0
        assert metrics[f"nv_cache_miss_duration_per_model{labels}"] >= 0
        assert not any('model="plain"' in name for name in metrics)
        assert "# TYPE nv_cache_num_hits_per_model counter" in text
        assert "# TYPE nv_cache_num_lookups gauge" in text
        assert metrics["nv_cache_num_lookups"] == 4
        assert (metrics["nv_cache_num_hits"], metrics["nv_cache_num_misses"]) == (2, 2)
        assert metrics["nv_cache_num_entries"] == 2
        assert 0 < metrics["nv_cache_util"] < 1
        assert f"nv_inference_count{labels} 2" in text  # rows of misses only

        http = {
            entry["name"]: entry["inference_stats"]
            for entry in (await plane.client.get("/v2/models/stats")).json()["model_stats"]
        }
        assert http["cached"]["cache_hit"]["count"] == 2
        assert http["plain"]["cache_hit"] == {"count": 0, "ns": 0}
        assert http["plain"]["cache_miss"] == {"count": 0, "ns": 0}
        call = plane.grpc_channel.unary_unary(
            "/inference.GRPCInferenceService/ModelStatistics",
            request_serializer=pb.ModelStatisticsRequest.SerializeToString,
            response_deserializer=pb.ModelStatisticsResponse.FromString,
        )
        response = await call(pb.ModelStatisticsRequest(name="cached"), timeout=WAIT_S)
        stats = response.model_stats[0].inference_stats
        assert (stats.cache_hit.count, stats.cache_hit.ns) == (
            http["cached"]["cache_hit"]["count"],
            http["cached"]["cache_hit"]["ns"],
        )
        assert (stats.cache_miss.count, stats.cache_miss.ns) == (
            http["cached"]["cache_miss"]["count"],
            http["cached"]["cache_miss"]["ns"],
        )
        assert stats.success.count == 4


async def test_a_grpc_request_is_answered_from_the_cache_too(repo: Path, tmp_path: Path) -> None:
    async with cached_data_plane(
        repo, tmp_path / "cache", response_cache_bytes=1 << 20, load_models=("cached",)
    ) as plane:
        infer_call = plane.grpc_channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        request = pb.ModelInferRequest(model_name="cached")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
        request.raw_input_contents.append(np.array([7.0, 8.0], np.float32).tobytes())

        async def calls() -> list[float]:
            response = await infer_call(request, timeout=WAIT_S)
            index = [o.name for o in response.outputs].index("CALLS")
            values = np.frombuffer(response.raw_output_contents[index], np.float32)
            return [float(v) for v in values]

        assert await calls() == [1.0, 1.0]
        assert await calls() == [1.0, 1.0]
        # HTTP and gRPC requests with the same inputs share the answer.
        assert (await _infer(plane, "cached", _body([7.0, 8.0])))["CALLS"] == [1.0, 1.0]
        inference = (await _inference_stats(plane, "cached"))["inference_stats"]
        assert (inference["cache_hit"]["count"], inference["cache_miss"]["count"]) == (2, 1)


async def test_without_a_server_cache_the_model_serves_uncached(repo: Path, tmp_path: Path) -> None:
    async with cached_data_plane(
        repo, tmp_path / "cache", response_cache_bytes=0, load_models=("cached",)
    ) as plane:
        assert (await _infer(plane, "cached", _body([1.0])))["CALLS"] == [1]
        assert (await _infer(plane, "cached", _body([1.0])))["CALLS"] == [2]
        assert plane.repository.get("cached").response_cache is None
        assert "nv_cache" not in (await plane.client.get("/metrics")).text
        inference = (await _inference_stats(plane, "cached"))["inference_stats"]
        assert inference["cache_miss"] == {"count": 0, "ns": 0}


async def test_cached_answers_handed_out_in_process_are_read_only(
    repo: Path, tmp_path: Path
) -> None:
    async with cached_data_plane(
        repo, tmp_path / "cache", response_cache_bytes=1 << 20, load_models=("cached",)
    ) as plane:
        model = plane.repository.get("cached")

        def request() -> InferRequest:
            data = np.array([[5.0, 6.0]], dtype=np.float32)
            return InferRequest(
                id=None,
                inputs=[InferInput("INPUT0", "FP32", (1, 2), data)],
                outputs=None,
                parameters={},
                binary_data_output=False,
                priority=0,
                timeout_us=0,
            )

        first = {o.name: o.data for o in await infer(model, request())}
        first["OUTPUT0"][0, 0] = -1.0  # the miss's caller owns what it was given
        hit = {o.name: o.data for o in await infer(model, request())}
        np.testing.assert_array_equal(hit["OUTPUT0"], [[10.0, 12.0]])
        with pytest.raises(ValueError, match="read-only"):
            hit["OUTPUT0"][0, 0] = -1.0
        assert model.stats.cache_hit.count == 1


async def test_unloading_drops_the_models_answers(repo: Path, tmp_path: Path) -> None:
    async with cached_data_plane(
        repo, tmp_path / "cache", response_cache_bytes=1 << 20, load_models=("cached", "plain")
    ) as plane:
        await _infer(plane, "cached", _body([1.0]))
        assert plane.response_cache is not None
        assert plane.response_cache.snapshot().entries == 1
        unload = await plane.client.post("/v2/repository/models/cached/unload")
        assert unload.status_code == 200
        assert plane.response_cache.snapshot().entries == 0
        load = await plane.client.post("/v2/repository/models/cached/load")
        assert load.status_code == 200
        assert (await _infer(plane, "cached", _body([1.0])))["CALLS"] == [1]


async def test_a_model_given_its_requests_keys_on_parameters_and_outputs(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    config = make_config(
        "scaled",
        backend="python",
        inputs=[("INPUT0", "FP32", (-1,))],
        outputs=[("OUTPUT0", "FP32", (-1,)), ("CALLS", "FP32", (-1,))],
    )
    config.response_cache.enable = True
    write_python_backend_model(repo, config, TRITON_FORM_MODEL)
    async with cached_data_plane(
        repo, tmp_path / "cache", response_cache_bytes=1 << 20, load_models=("scaled",)
    ) as plane:
        assert await _infer(plane, "scaled", _body([1.0], scale=2)) == {
            "OUTPUT0": [2.0],
            "CALLS": [1.0],
        }
        assert (await _infer(plane, "scaled", _body([1.0], scale=2)))["CALLS"] == [1.0]
        assert await _infer(plane, "scaled", _body([1.0], scale=3)) == {
            "OUTPUT0": [3.0],
            "CALLS": [2.0],
        }
        asked = {**_body([1.0], scale=2), "outputs": [{"name": "OUTPUT0"}]}
        assert await _infer(plane, "scaled", asked) == {"OUTPUT0": [2.0]}
        assert await _infer(plane, "scaled", {**asked, "outputs": [{"name": "CALLS"}]}) == {
            "CALLS": [4.0]
        }
        inference = (await _inference_stats(plane, "scaled"))["inference_stats"]
        assert (inference["cache_hit"]["count"], inference["cache_miss"]["count"]) == (1, 4)


@pytest.mark.parametrize(
    ("setting", "text"),
    [
        pytest.param(
            "decoupled",
            "Response Cache does not currently support model refused with 'decoupled' "
            "transaction policy. Please disable the response cache.",
            id="decoupled",
        ),
        pytest.param(
            "sequence",
            "Response Cache does not currently support model refused with sequence batching "
            "scheduler. Please disable the response cache.",
            id="sequence",
        ),
    ],
)
async def test_models_triton_cannot_cache_are_refused_at_load(
    tmp_path: Path, setting: str, text: str
) -> None:
    repo = tmp_path / "repo"
    model_dir = _write_counter(repo, "refused", cache=True)
    config = read_config(model_dir)
    if setting == "decoupled":
        config.model_transaction_policy.decoupled = True
    else:
        config.sequence_batching.SetInParent()
    write_config(model_dir, config)
    async with cached_data_plane(
        repo, tmp_path / "cache", response_cache_bytes=1 << 20, load_models=()
    ) as plane:
        response = await plane.client.post("/v2/repository/models/refused/load")
        assert response.status_code != 200
        assert response.json()["error"] == (
            f"failed to load 'refused', failed to poll from model repository: {text}"
        )
        # The same model without the cache is not refused for the cache.
        config.response_cache.enable = False
        override = {"parameters": {"config": json.dumps(_json_config(config))}}
        again = await plane.client.post("/v2/repository/models/refused/load", json=override)
        assert "Response Cache" not in again.text


def _json_config(config: mc.ModelConfig) -> dict[str, Any]:
    return json_format.MessageToDict(config)
