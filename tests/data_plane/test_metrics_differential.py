"""Statistics and metrics as Triton's tools read them, real Triton 2.51 against ``zeroserve
serve`` on the same repository: a decoupled model's stream (tritonclient's gRPC stream)
counted as successes in ``/stats`` and ``nv_inference_*``; a Python-backend model's
custom metrics (counter, gauge, histogram, labels, set from ``execute``) and their
refusals; the metrics port, the server's extensions and the host gauges' families. The
same model through zeroserve's in-process path gives the same custom metrics. Skips,
saying why, where Triton cannot run here.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from foundation.proto import model_config_pb2 as mc
from tests.integration.conftest import ServerProcess, free_port, start_server
from tests.models import write_config
from tests.triton_oracle import TritonServer, triton_for, write_python_backend_model

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0

METRICS_MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily
        self.seen = family("requests_seen", "Requests this model saw", family.COUNTER)
        self.last = family("last_value", "The last input's first value", family.GAUGE)
        self.sums = family("input_sum", "Sum of each input", family.HISTOGRAM)
        self.counter = self.seen.Metric(labels={"model": "metrics", "kind": "a"})
        self.counter_b = self.seen.Metric(labels={"model": "metrics", "kind": 'b"q'})
        self.gauge = self.last.Metric(labels={"model": "metrics"})
        self.histogram = self.sums.Metric(labels={"model": "metrics"}, buckets=[1.0, 10.0, 100.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            self.counter.increment(1)
            self.counter_b.increment(2.5)
            self.gauge.set(float(x.flat[0]))
            self.gauge.increment(-0.5)
            self.histogram.observe(float(x.sum()))
            values = np.array([self.counter.value(), self.gauge.value()], dtype=np.float64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", values)]))
        return responses
"""
"""Triton's contract: a stub process on both servers."""

IN_PROCESS_MODEL = """\
import numpy as np
from runtimes.python_backend import pb_utils


class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily
        self.seen = family("inproc_requests_seen", "Requests this model saw", family.COUNTER)
        self.last = family("inproc_last_value", "The last input's first value", family.GAUGE)
        self.sums = family("inproc_input_sum", "Sum of each input", family.HISTOGRAM)
        self.counter = self.seen.Metric(labels={"model": "metrics", "kind": "a"})
        self.counter_b = self.seen.Metric(labels={"model": "metrics", "kind": 'b"q'})
        self.gauge = self.last.Metric(labels={"model": "metrics"})
        self.histogram = self.sums.Metric(labels={"model": "metrics"}, buckets=[1.0, 10.0, 100.0])

    def execute(self, inputs):
        x = inputs["INPUT0"]
        self.counter.increment(1)
        self.counter_b.increment(2.5)
        self.gauge.set(float(x.flat[0]))
        self.gauge.increment(-0.5)
        self.histogram.observe(float(x.sum()))
        return {"OUTPUT0": np.array([self.counter.value(), self.gauge.value()], dtype=np.float64)}
"""
"""The same metrics from zeroserve's dict contract (in the server's process)."""

REFUSALS_MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils


def attempt(operation):
    try:
        return "ok " + str(operation())
    except Exception as exc:
        return type(exc).__name__ + ": " + str(exc)


class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily
        self.counters = family("refusal_counter", "c", family.COUNTER)
        self.gauges = family("refusal_gauge", "g", family.GAUGE)
        self.histograms = family("refusal_histogram", "h", family.HISTOGRAM)
        self.counter = self.counters.Metric(labels={"a": "1"})
        self.histogram = self.histograms.Metric(labels={"a": "1"}, buckets=[1.0, 2.0])
        self.gauge = self.gauges.Metric()

    def execute(self, requests):
        family = pb_utils.MetricFamily
        attempts = [
            lambda: self.counter.increment(-1),
            lambda: self.counter.set(3),
            lambda: self.counter.observe(3),
            lambda: self.histogram.value(),
            lambda: self.histogram.increment(1),
            lambda: self.histogram.set(1),
            lambda: self.gauge.observe(1),
            lambda: self.gauge.value(),
            lambda: self.counters.Metric(labels={"a": "1"}, buckets=[1.0]),
            lambda: self.histograms.Metric(labels={"a": "2"}),
            lambda: self.histograms.Metric(labels="x", buckets=[1.0]),
            lambda: self.histograms.Metric(labels={"a": "3"}, buckets=(1.0,)),
            lambda: self.histograms.Metric(labels={"a": "4"}, buckets=[2.0, 1.0]),
            lambda: self.counters.Metric(labels={"a": 1}),
            lambda: self.counters.Metric(labels={"bad key": "1"}),
            lambda: family("refusal_counter", "c", family.GAUGE) and None,
            lambda: family("bad name", "c", family.COUNTER) and None,
            lambda: self.counters.Metric(labels={"a": "1"}).value(),
            lambda: (int(family.COUNTER), int(family.GAUGE), int(family.HISTOGRAM)),
        ]
        texts = np.array([attempt(a) for a in attempts], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", texts)]) for _ in requests]
"""
"""Every refusal of the metric API, each answered with Triton's exception text."""

DECOUPLED_MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender = request.get_response_sender()
            for step in range(3):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + step)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
"""Three responses and a bare final flag per request."""

TRITON_MODELS = ("metrics", "repeat")
STREAMED = 2
"""Requests sent on the decoupled model's stream."""


def _config(name: str, output_type: int, *, decoupled: bool = False) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, max_batch_size=0)
    config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[4])
    config.output.add(name="OUTPUT0", data_type=output_type, dims=[-1])
    config.model_transaction_policy.decoupled = decoupled
    return config


@dataclass(frozen=True)
class Servers:
    triton: TritonServer
    zeroserve: ServerProcess
    zeroserve_grpc: str
    zeroserve_metrics: str
    """zeroserve's metrics port URL (``.../metrics``)."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    repo = tmp_path_factory.mktemp("repo")
    write_python_backend_model(repo, _config("metrics", mc.TYPE_FP64), METRICS_MODEL)
    write_python_backend_model(
        repo, _config("repeat", mc.TYPE_FP32, decoupled=True), DECOUPLED_MODEL
    )
    loads = [f"--load-model={name}" for name in TRITON_MODELS]
    with triton_for(
        repo, tmp_path_factory.mktemp("triton-log"), "--model-control-mode=explicit", *loads
    ) as triton:
        # zeroserve alone gets the in-process twin (Triton has no such contract) and the
        # refusals (see TRITON_REFUSALS).
        write_python_backend_model(repo, _config("refusals", mc.TYPE_STRING), REFUSALS_MODEL)
        twin = _config("inproc", mc.TYPE_FP64)
        twin.backend = "python"
        write_config(repo / "inproc", twin)
        (repo / "inproc" / "1").mkdir(parents=True)
        (repo / "inproc" / "1" / "model.py").write_text(IN_PROCESS_MODEL)
        grpc_port, metrics_port = free_port(), free_port()
        zeroserve = start_server(
            repo,
            tmp_path_factory.mktemp("zeroserve-log"),
            "--grpc-port",
            str(grpc_port),
            "--metrics-port",
            str(metrics_port),
            "--model-control-mode=explicit",
            *loads,
            "--load-model=inproc",
            "--load-model=refusals",
        )
        try:
            with httpx.Client(base_url=zeroserve.url, timeout=TIMEOUT_S) as client:
                for model in (*TRITON_MODELS, "inproc", "refusals"):
                    assert client.get(f"/v2/models/{model}/ready").status_code == 200, model
            yield Servers(
                triton,
                zeroserve,
                f"127.0.0.1:{grpc_port}",
                f"http://127.0.0.1:{metrics_port}/metrics",
            )
        finally:
            zeroserve.stop()


Samples = dict[str, dict[tuple[tuple[str, str], ...], str]]


def parse_exposition(text: str) -> tuple[dict[str, tuple[str, str]], Samples]:
    """Each family's (HELP, TYPE) and each sample's value by metric name and labels."""
    described: dict[str, list[str]] = {}
    samples: Samples = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            described.setdefault(name, ["", ""])[0] = help_text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            described.setdefault(name, ["", ""])[1] = kind
        elif line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            name, _, rest = head.partition("{")
            samples.setdefault(name, {})[_labels(rest.rstrip("}"))] = value
    return {k: (v[0], v[1]) for k, v in described.items()}, samples


def _labels(text: str) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    while text:
        name, _, text = text.partition('="')
        value = []
        index = 0
        while text[index] != '"':
            if text[index] == "\\":
                index += 1
            value.append(text[index])
            index += 1
        pairs.append((name, "".join(value)))
        text = text[index + 1 :].lstrip(",")
    return tuple(sorted(pairs))


def _family(text: str, prefix: str, names: tuple[str, ...]) -> dict[str, Any]:
    """The families ``names`` (``prefix`` stripped from zeroserve's twins): descriptions
    and samples, histogram series included."""
    described, samples = parse_exposition(text)
    found: dict[str, Any] = {}
    for name in names:
        found[name] = described.get(prefix + name)
        for suffix in ("", "_count", "_sum", "_bucket"):
            if prefix + name + suffix in samples:
                found[name + suffix] = samples[prefix + name + suffix]
    return found


def _infer(base: str, model: str, data: list[float]) -> dict[str, Any]:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": data}]}
    response = httpx.post(f"{base}/v2/models/{model}/infer", json=body, timeout=TIMEOUT_S)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


CUSTOM = ("requests_seen", "last_value", "input_sum")


def test_custom_metrics_read_as_tritons(servers: Servers) -> None:
    answers = {}
    for base, model in (
        (servers.triton.http_url, "metrics"),
        (servers.zeroserve.url, "metrics"),
        (servers.zeroserve.url, "inproc"),
    ):
        outputs = [_infer(base, model, [1, 2, 3, 4])["outputs"][0]["data"] for _ in range(2)]
        outputs.append(_infer(base, model, [50, 0, 0, 0])["outputs"][0]["data"])
        answers[(base, model)] = outputs
    assert len({str(a) for a in answers.values()}) == 1, answers
    assert answers[(servers.triton.http_url, "metrics")][-1] == [3.0, 49.5]
    triton = _family(httpx.get(servers.triton.metrics_url).text, "", CUSTOM)
    on_port = httpx.get(servers.zeroserve_metrics).text
    on_http = httpx.get(f"{servers.zeroserve.url}/metrics").text
    assert _family(on_port, "", CUSTOM) == triton
    assert _family(on_http, "", CUSTOM) == triton
    assert _family(on_http, "inproc_", CUSTOM) == triton
    assert triton["input_sum_bucket"][(("le", "100"), ("model", "metrics"))] == "3"


PREFIX = "Failed to process the request for model 'refusals_0', message: "
TRITON_REFUSALS = [
    "TritonModelException: Failed to increment metric value: "
    + PREFIX
    + "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
    "non-negative values.",
    "TritonModelException: Failed to set metric value: "
    + PREFIX
    + "TRITONSERVER_METRIC_KIND_COUNTER does not support Set",
    "TritonModelException: Failed to observe metric value: "
    + PREFIX
    + "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe",
    "TritonModelException: Failed to get metric value: "
    + PREFIX
    + "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value",
    "TritonModelException: Failed to increment metric value: "
    + PREFIX
    + "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment",
    "TritonModelException: Failed to set metric value: "
    + PREFIX
    + "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Set",
    "TritonModelException: Failed to observe metric value: "
    + PREFIX
    + "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe",
    "ok 0.0",
    "TritonModelException: Failed to create metric. Unexpected buckets found.",
    "TritonModelException: Failed to create metric. Missing required buckets.",
    "TritonModelException: Failed to create metric. Labels must be a dictionary.",
    "TritonModelException: Failed to create metric. Buckets must be a list.",
    "TritonModelException: Error when creating Metric: "
    + PREFIX
    + "Bucket Boundaries must be strictly sorted",
    "TritonModelException: Error when creating Metric: "
    + PREFIX
    + "attempt to access JSON non-string as string",
    "TritonModelException: Error when creating Metric: " + PREFIX + "Invalid label name",
    "TritonModelException: Error when creating MetricFamily: "
    + PREFIX
    + "Family name already exists with different type",
    "TritonModelException: Error when creating MetricFamily: " + PREFIX + "Invalid metric name",
    "ok 0.0",
    "ok (0, 1, 2)",
]
"""What REFUSALS_MODEL answers on Triton 2.51, recorded from it: run live, that Triton
aborts after a few refused metric operations (``boost::interprocess::lock_exception`` in
its Python backend, at random within a few requests), taking the other tests' oracle
with it."""


def test_metric_refusals_read_as_tritons(servers: Servers) -> None:
    texts = _infer(servers.zeroserve.url, "refusals", [0, 0, 0, 0])["outputs"][0]["data"]
    # Triton's texts name the instance "<model>_0", a zeroserve stub "<model>_0_0".
    assert [t.replace("refusals_0_0", "refusals_0") for t in texts] == TRITON_REFUSALS
    again = _infer(servers.zeroserve.url, "refusals", [0, 0, 0, 0])["outputs"][0]["data"]
    assert again == texts


def _stream(address: str) -> list[tuple[str, bool]]:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(address)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for index in range(STREAMED):
            tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
            tensor.set_data_from_numpy(np.full(4, index, np.float32))
            client.async_stream_infer(
                "repeat", [tensor], request_id=str(index), enable_empty_final_response=True
            )
        received = []
        for _ in range(STREAMED * 4):
            result, error = answers.get(timeout=TIMEOUT_S)
            assert error is None, error
            response = result.get_response()
            received.append((response.id, response.parameters["triton_final_response"].bool_param))
        client.stop_stream()
    finally:
        client.close()
    return sorted(received)


def _counts(stats: dict[str, Any]) -> dict[str, Any]:
    """What a statistics entry says besides durations and times of day."""
    entry = stats["model_stats"][0]
    inference = {k: v["count"] for k, v in entry["inference_stats"].items()}
    batches = {b["batch_size"]: b["compute_infer"]["count"] for b in entry["batch_stats"]}
    return {
        "inference": inference,
        "inference_count": entry["inference_count"],
        "execution_count": entry["execution_count"],
        "batches": batches,
        "response_stats": entry["response_stats"],
    }


def _request_counters(text: str) -> dict[str, Any]:
    _, samples = parse_exposition(text)
    wanted = (
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
    )
    return {
        name: {k: v for k, v in samples[name].items() if ("model", "repeat") in k}
        for name in wanted
    }


def test_a_decoupled_stream_counts_successes_as_triton(servers: Servers) -> None:
    streamed = [_stream(servers.triton.grpc_address), _stream(servers.zeroserve_grpc)]
    assert streamed[0] == streamed[1]
    counts = [
        _counts(httpx.get(f"{base}/v2/models/repeat/stats", timeout=TIMEOUT_S).json())
        for base in (servers.triton.http_url, servers.zeroserve.url)
    ]
    assert counts[1] == counts[0]
    assert counts[0]["inference"]["success"] == STREAMED
    assert counts[0]["inference"]["fail"] == 0
    counters = [
        _request_counters(httpx.get(url).text)
        for url in (servers.triton.metrics_url, servers.zeroserve_metrics)
    ]
    assert counters[1] == counters[0]


HOST_FAMILIES = (
    "nv_cpu_utilization",
    "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes",
    "nv_pinned_memory_pool_total_bytes",
    "nv_pinned_memory_pool_used_bytes",
)


def test_host_families_and_extensions_are_tritons(servers: Servers) -> None:
    triton, _ = parse_exposition(httpx.get(servers.triton.metrics_url).text)
    ours, samples = parse_exposition(httpx.get(servers.zeroserve_metrics).text)
    assert {name: ours.get(name) for name in HOST_FAMILIES} == {
        name: triton[name] for name in HOST_FAMILIES
    }
    assert 0.0 <= float(samples["nv_cpu_utilization"][()]) <= 1.0
    total = int(samples["nv_cpu_memory_total_bytes"][()])
    assert 0 < int(samples["nv_cpu_memory_used_bytes"][()]) <= total
    extensions = [
        httpx.get(f"{base}/v2", timeout=TIMEOUT_S).json()["extensions"]
        for base in (servers.triton.http_url, servers.zeroserve.url)
    ]
    # CUDA shared memory is the one extension zeroserve leaves out (no CUDA IPC).
    assert extensions[1] == [e for e in extensions[0] if e != "cuda_shared_memory"]
    assert "sequence" in extensions[1]


def test_the_metrics_port_serves_metrics_only(servers: Servers) -> None:
    base = servers.zeroserve_metrics.removesuffix("/metrics")
    assert httpx.get(f"{base}/v2/health/ready").status_code == 404
    assert httpx.get(servers.zeroserve_metrics).headers["content-type"].startswith("text/plain")


def test_metrics_can_be_disallowed(tmp_path: Path) -> None:
    metrics_port = free_port()
    server = start_server(
        tmp_path, tmp_path, "--metrics-port", str(metrics_port), "--allow-metrics=false"
    )
    try:
        assert httpx.get(f"{server.url}/metrics").status_code == 404
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        server.stop()
