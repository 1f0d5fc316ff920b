"""The response cache against real Triton 2.51: the same repository of Python-backend models
(one with ``response_cache { enable: true }``, one without) served by Triton and by
``zeroserve serve``, both with ``--cache-config local,size=1048576``; the same requests to
both give the same answers, the same statistics (every count, over HTTP and gRPC, with the
same fields), the same ``nv_cache_*`` metric families, labels and counts, and configs Triton
refuses a cache for are refused with its words. Skips, saying why, where Triton cannot run.

Not compared: durations (each server's own), ``nv_cache_util`` (Triton's allocator adds its
own overhead to each entry; both are checked to lie in (0, 1]) and answers to requests whose
inputs have the same bytes in another shape, which Triton answers from the cache with the
other shape's answer (its key has no shapes) and zeroserve answers as a new request.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from google.protobuf.message import Message

from bench.server import free_port as _free_port
from tests.integration.conftest import ServerProcess, start_server
from tests.models import make_config
from tests.triton_oracle import (
    TritonServer,
    require_triton,
    run_triton,
    write_python_backend_model,
)

pytestmark = pytest.mark.integration

CACHE_CONFIG = "local,size=1048576"
TIMEOUT_S = 60.0

DOUBLE_MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return responses
"""


@dataclass(frozen=True)
class Servers:
    triton: TritonServer
    zeroserve: ServerProcess
    zeroserve_grpc: str


def _write_repository(repo: Path) -> None:
    for name in ("cached", "plain", "decoupled", "sequence"):
        config = make_config(
            name,
            backend="python",
            inputs=[("INPUT0", "FP32", (-1,))],
            outputs=[("OUTPUT0", "FP32", (-1,))],
        )
        config.response_cache.enable = name != "plain"
        if name == "decoupled":
            config.model_transaction_policy.decoupled = True
        if name == "sequence":
            config.ClearField("dynamic_batching")
            config.sequence_batching.SetInParent()
        write_python_backend_model(repo, config, DOUBLE_MODEL)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    install = require_triton()
    repo = tmp_path_factory.mktemp("repo")
    _write_repository(repo)
    loads = ("--model-control-mode=explicit", "--load-model=cached", "--load-model=plain")
    with run_triton(
        install,
        repo,
        tmp_path_factory.mktemp("triton-log"),
        f"--cache-config={CACHE_CONFIG}",
        f"--cache-directory={install.caches}",
        "--metrics-interval-ms=100",
        *loads,
    ) as triton:
        grpc_port = _free_port()
        zeroserve = start_server(
            repo,
            tmp_path_factory.mktemp("zeroserve-log"),
            "--grpc-port",
            str(grpc_port),
            "--cache-config",
            CACHE_CONFIG,
            *loads,
        )
        try:
            with httpx.Client(base_url=zeroserve.url, timeout=TIMEOUT_S) as client:
                for model in ("cached", "plain"):
                    assert client.get(f"/v2/models/{model}/ready").status_code == 200
            yield Servers(triton, zeroserve, f"127.0.0.1:{grpc_port}")
        finally:
            zeroserve.stop()


def _body(values: Sequence[float]) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, len(values)], "data": values}
        ]
    }


def _infer_both(servers: Servers, model: str, values: Sequence[float]) -> None:
    answers = [
        httpx.post(f"{base}/v2/models/{model}/infer", json=_body(values), timeout=TIMEOUT_S)
        for base in (servers.triton.http_url, servers.zeroserve.url)
    ]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[1].json() == answers[0].json()


def _counts(value: Any) -> Any:
    """``value`` with every duration's ``ns`` and the last inference's time blanked: the
    fields and every count stay."""
    if isinstance(value, dict):
        return {
            k: ("ns" if k in ("ns", "last_inference") else _counts(v)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_counts(v) for v in value]
    return value


def _fields(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )


_SERIES = re.compile(r"^(?P<name>[a-z_]+)(?P<labels>\{[^}]*\})? (?P<value>\S+)$")


def _cache_metrics(text: str) -> tuple[list[str], dict[str, float]]:
    """The ``nv_cache_*`` families' HELP and TYPE lines, and their series by name and
    labels."""
    described = sorted(
        line for line in text.splitlines() if re.match(r"^# (HELP|TYPE) nv_cache_", line)
    )
    series = {}
    for line in text.splitlines():
        match = _SERIES.match(line)
        if match and match["name"].startswith("nv_cache_"):
            series[match["name"] + (match["labels"] or "")] = float(match["value"])
    return described, series


def _settled_metrics(url: str, *, misses: int) -> str:
    """Triton's metrics once its server-wide cache gauges count ``misses``: its metrics
    thread refreshes them once per ``--metrics-interval-ms``, so a read right after the
    requests can still show the previous count."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        text = httpx.get(url, timeout=TIMEOUT_S).text
        if _cache_metrics(text)[1].get("nv_cache_num_misses") == misses:
            return text
        if time.monotonic() > deadline:
            return text  # the comparison below shows what differs
        time.sleep(0.05)


def _big(value: float) -> list[float]:
    return [value] * 50_000  # 200 kB an answer: five fit in the cache, a sixth evicts


def test_the_same_answers_statistics_and_metrics(servers: Servers) -> None:
    for values in ([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8]):
        _infer_both(servers, "cached", values)
        _infer_both(servers, "plain", values)
    for n in range(6):
        _infer_both(servers, "cached", _big(float(n)))
    _infer_both(servers, "cached", _big(0.0))  # evicted: a miss again
    _infer_both(servers, "cached", _big(5.0))  # a hit
    for _ in range(2):
        _infer_both(servers, "cached", [1.0] * 300_000)  # larger than the whole cache

    for model in ("cached", "plain"):
        path = f"/v2/models/{model}/stats"
        triton = httpx.get(servers.triton.http_url + path, timeout=TIMEOUT_S).json()
        zeroserve = httpx.get(servers.zeroserve.url + path, timeout=TIMEOUT_S).json()
        assert _counts(zeroserve) == _counts(triton), model
        with (
            grpcclient.InferenceServerClient(servers.triton.grpc_address) as triton_grpc,
            grpcclient.InferenceServerClient(servers.zeroserve_grpc) as zeroserve_grpc,
        ):
            expected = triton_grpc.get_inference_statistics(model)
            actual = zeroserve_grpc.get_inference_statistics(model)
        # Every field, zero ones too: the same fields must be there either way.
        assert _counts(_fields(actual)) == _counts(_fields(expected)), model
        if model == "cached":
            inference = triton["model_stats"][0]["inference_stats"]
            assert (inference["cache_hit"]["count"], inference["cache_miss"]["count"]) == (3, 11)

    triton_text = _settled_metrics(servers.triton.metrics_url, misses=11)
    zeroserve_text = httpx.get(servers.zeroserve.url + "/metrics", timeout=TIMEOUT_S).text
    triton_described, triton_series = _cache_metrics(triton_text)
    zeroserve_described, zeroserve_series = _cache_metrics(zeroserve_text)
    assert zeroserve_described == triton_described
    assert sorted(zeroserve_series) == sorted(triton_series)
    for name, value in triton_series.items():
        if "duration" in name:
            assert zeroserve_series[name] >= 0
        elif name == "nv_cache_util":
            assert 0 < zeroserve_series[name] <= 1 and 0 < value <= 1
        else:
            assert zeroserve_series[name] == value, name
    labels = '{model="cached",version="1"}'
    assert triton_series[f"nv_cache_num_hits_per_model{labels}"] == 3
    assert triton_series["nv_cache_num_evictions"] > 0


@pytest.mark.parametrize("model", ["decoupled", "sequence"])
def test_configs_triton_refuses_a_cache_for(servers: Servers, model: str) -> None:
    path = f"/v2/repository/models/{model}/load"
    triton = httpx.post(servers.triton.http_url + path, timeout=TIMEOUT_S)
    zeroserve = httpx.post(servers.zeroserve.url + path, timeout=TIMEOUT_S)
    assert triton.status_code != 200 and zeroserve.status_code != 200
    # Triton answers without the reason and logs it; zeroserve's answer carries it.
    expected = triton.json()["error"]
    assert expected == f"failed to load '{model}', failed to poll from model repository"
    actual = zeroserve.json()["error"]
    assert actual.startswith(expected + ": ")
    reason = actual.removeprefix(expected + ": ")
    assert f"Poll failed for model directory '{model}': {reason}" in servers.triton.log()


@pytest.mark.parametrize("model", ["cached", "plain"])
def test_a_model_config_reads_back_its_cache_setting(servers: Servers, model: str) -> None:
    path = f"/v2/models/{model}/config"
    triton = httpx.get(servers.triton.http_url + path, timeout=TIMEOUT_S).json()
    zeroserve = httpx.get(servers.zeroserve.url + path, timeout=TIMEOUT_S).json()
    assert zeroserve["response_cache"] == triton["response_cache"]
    assert triton["response_cache"] == {"enable": model == "cached"}
