"""The same repository of ensembles over Triton Python-backend models (the same
``model.py`` files), served by real Triton 2.51 and by ``zeroserve serve`` (a real
process); the same requests, good and bad, to both: the same statuses, texts and answers,
over HTTP and gRPC. Skips, saying why, where Triton cannot run here.

Known and intended differences, not compared:

- Triton answers an ensemble's outputs in the order its steps produced them (or its
  maps' hash order); zeroserve in the config's order. Outputs are compared by name.
- Triton adds ``sequence_id``, ``sequence_start`` and ``sequence_end`` (each once per
  output, so repeated) to an ensemble's response parameters when a Python-backend step
  wrote an output; zeroserve's responses carry no parameters.
- A config Triton refuses on its own ("failed to poll from model repository") is 500 on
  Triton without the reason; zeroserve gives the same words followed by Triton's reason
  (which Triton only logs).
- Triton counts each failed ensemble request twice in its ``fail`` statistics; zeroserve
  once.
- Once a load of ``cyc_a`` (one of two ensembles using each other) has failed, Triton
  answers a load of ``cyc_b`` with "no version is available" (500); zeroserve with the
  circular dependency again. Only ``cyc_a`` is compared.
- An unload returns while Triton's model is still UNLOADING in the index; zeroserve's
  returns once it is unloaded (UNAVAILABLE). Compared as the same.
- A bad input shape's text ends, as everywhere in zeroserve, as later Triton's ("...docs
  for allowed inference request shapes."), not 2.51's ("...for more info on
  max_batch_size."); the rest is the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.data_plane.ensemble.triton_repository import BAD, STARTUP, write_repository
from tests.triton_oracle import ServerPair, explicit_pair

pytestmark = pytest.mark.integration


Servers = ServerPair


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    repo = write_repository(tmp_path_factory.mktemp("repo"))
    with explicit_pair(repo, tmp_path_factory, STARTUP) as pair:
        yield pair


def _post(base: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    response = httpx.post(base + path, json=body, timeout=60.0)
    return response.status_code, response.json() if response.content else None


def _comparable(body: Any) -> Any:
    """A response body with its outputs by name and without response parameters."""
    if not isinstance(body, dict) or "outputs" not in body:
        return body
    kept = {k: v for k, v in body.items() if k not in ("outputs", "parameters")}
    kept["outputs"] = {o["name"]: o for o in body["outputs"]}
    return kept


def _both(
    servers: Servers, path: str, body: dict[str, Any] | None = None, *, same_text: bool = True
) -> tuple[int, Any]:
    """Send the same request to both; the statuses and bodies must be equal (without
    ``same_text``, an error's text up to its NOTE)."""
    status, answer = _post(servers.triton.http_url, path, body)
    actual = _post(servers.zeroserve.url, path, body)
    if not same_text:
        assert actual[0] == status
        assert actual[1]["error"].split("NOTE:")[0] == answer["error"].split("NOTE:")[0]
        return status, answer
    assert (actual[0], _comparable(actual[1])) == (status, _comparable(answer))
    return status, answer


def _fp32(name: str, data: list[float], shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": shape, "data": data}


ROW = [1.0, 2.0, 3.0, 4.0]
NEGATIVE = [-1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize(
    ("model", "body"),
    [
        pytest.param("pipe", {"inputs": [_fp32("IN", ROW, [1, 4])]}, id="pipeline"),
        pytest.param(
            "pipe", {"id": "p2", "inputs": [_fp32("IN", ROW + NEGATIVE, [2, 4])]}, id="batch-of-2"
        ),
        pytest.param(
            "pipe",
            {"inputs": [_fp32("IN", ROW, [1, 4])], "outputs": [{"name": "D"}]},
            id="one-output",
        ),
        pytest.param("dag", {"inputs": [_fp32("IN", ROW + ROW, [2, 4])]}, id="two-branches"),
        pytest.param("nested", {"inputs": [_fp32("X", ROW, [1, 4])]}, id="ensemble-of-ensembles"),
        pytest.param(
            "nested",
            {"inputs": [_fp32("X", ROW, [1, 4])], "outputs": [{"name": "Z"}]},
            id="nested-one-output",
        ),
        pytest.param("versioned", {"inputs": [_fp32("IN", ROW, [1, 4])]}, id="versions"),
        pytest.param(
            "ens_flat", {"inputs": [_fp32("IN", ROW + ROW, [2, 4])]}, id="non-batching-step"
        ),
        pytest.param(
            "failing", {"id": "f1", "inputs": [_fp32("IN", NEGATIVE, [1, 4])]}, id="step-fails"
        ),
        pytest.param("raising", {"inputs": [_fp32("IN", ROW, [1, 4])]}, id="step-raises"),
        pytest.param(
            "nestfail", {"inputs": [_fp32("X", NEGATIVE, [1, 4])]}, id="nested-step-fails"
        ),
        pytest.param("ens_failarg", {"inputs": [_fp32("IN", ROW, [1, 4])]}, id="step-invalid-arg"),
        pytest.param("pipe", {"inputs": [_fp32("IN", ROW + [5.0], [1, 5])]}, id="bad-shape"),
        pytest.param(
            "pipe",
            {
                "inputs": [
                    {"name": "IN", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]}
                ]
            },
            id="bad-datatype",
        ),
        pytest.param("pipe", {"inputs": []}, id="no-inputs"),
        pytest.param(
            "pipe",
            {"inputs": [_fp32("IN", ROW, [1, 4])], "outputs": [{"name": "nope"}]},
            id="unknown-output",
        ),
        pytest.param("pipe", {"inputs": [_fp32("IN", ROW * 9, [9, 4])]}, id="batch-too-big"),
    ],
)
def test_the_same_infer_answers(servers: Servers, model: str, body: dict[str, Any]):
    shape = body["inputs"][0]["shape"] if body["inputs"] else None
    _both(servers, f"/v2/models/{model}/infer", body, same_text=shape != [1, 5])


def test_an_unknown_version_of_an_ensemble(servers: Servers):
    _both(servers, "/v2/models/pipe/versions/2/infer", {"inputs": [_fp32("IN", ROW, [1, 4])]})


def test_metadata_and_readiness(servers: Servers):
    for model in ("pipe", "nested", "dag"):
        triton = httpx.get(f"{servers.triton.http_url}/v2/models/{model}", timeout=30.0)
        ours = httpx.get(f"{servers.zeroserve.url}/v2/models/{model}", timeout=30.0)
        assert (ours.status_code, ours.json()) == (triton.status_code, triton.json())
        for path in (f"/v2/models/{model}/ready", f"/v2/models/{model}/versions/1/ready"):
            triton_ready = httpx.get(servers.triton.http_url + path, timeout=30.0)
            ours_ready = httpx.get(servers.zeroserve.url + path, timeout=30.0)
            assert ours_ready.status_code == triton_ready.status_code == 200


def test_the_config_of_an_ensemble(servers: Servers):
    triton = httpx.get(f"{servers.triton.http_url}/v2/models/pipe/config", timeout=30.0).json()
    ours = httpx.get(f"{servers.zeroserve.url}/v2/models/pipe/config", timeout=30.0).json()

    for key in ("name", "platform", "max_batch_size", "version_policy", "input", "output"):
        assert ours[key] == triton[key], key
    assert ours.get("instance_group", []) == triton["instance_group"] == []
    assert "optimization" not in ours and "optimization" not in triton
    assert "dynamic_batching" not in ours and "dynamic_batching" not in triton
    assert ours["ensemble_scheduling"] == triton["ensemble_scheduling"]


@pytest.mark.parametrize(
    "name", sorted(n for n in BAD if not n.startswith("poll_") and n != "cyc_b")
)
def test_ensembles_refused_once_their_models_are_known(servers: Servers, name: str):
    status, body = _both(servers, f"/v2/repository/models/{name}/load")

    assert status == 400
    assert body["error"].startswith(f"load failed for model '{name}': ")


@pytest.mark.parametrize("name", sorted(n for n in BAD if n.startswith("poll_")))
def test_ensembles_refused_from_their_config_alone(servers: Servers, name: str):
    triton_status, triton_body = _post(
        servers.triton.http_url, f"/v2/repository/models/{name}/load"
    )
    status, body = _post(servers.zeroserve.url, f"/v2/repository/models/{name}/load")

    assert (triton_status, triton_body) == (
        500,
        {"error": f"failed to load '{name}', failed to poll from model repository"},
    )
    assert status >= 400
    assert body["error"].startswith(triton_body["error"] + ": ")
    reason = body["error"].removeprefix(triton_body["error"] + ": ")
    assert f"ensemble '{name}'" in reason or f"ensemble {name}'" in reason


def test_failed_loads_leave_no_version_and_the_servers_ready(servers: Servers):
    for name in BAD:
        _post(servers.triton.http_url, f"/v2/repository/models/{name}/load")
        _post(servers.zeroserve.url, f"/v2/repository/models/{name}/load")

    index = _both(servers, "/v2/repository/index")[1]
    states = {row["name"]: row.get("state") for row in index}
    assert {states[name] for name in BAD} == {None}
    for base in (servers.triton.http_url, servers.zeroserve.url):
        assert httpx.get(f"{base}/v2/health/ready", timeout=30.0).status_code == 200


def test_statistics_of_an_ensemble(servers: Servers):
    for rows in (1, 2, 1):
        _both(servers, "/v2/models/counted/infer", {"inputs": [_fp32("IN", ROW * rows, [rows, 4])]})

    def stats(base: str) -> Any:
        return httpx.get(f"{base}/v2/models/counted/stats", timeout=30.0).json()["model_stats"][0]

    triton, ours = stats(servers.triton.http_url), stats(servers.zeroserve.url)
    assert (
        (ours["inference_count"], ours["execution_count"])
        == (
            triton["inference_count"],
            triton["execution_count"],
        )
        == (4, 3)
    )
    for kind in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
        assert ours["inference_stats"][kind]["count"] == triton["inference_stats"][kind]["count"]
        assert (ours["inference_stats"][kind]["ns"] > 0) == (
            triton["inference_stats"][kind]["ns"] > 0
        ), kind
    sizes = [(b["batch_size"], b["compute_infer"]["count"]) for b in ours["batch_stats"]]
    assert sizes == [(b["batch_size"], b["compute_infer"]["count"]) for b in triton["batch_stats"]]


def _grpc_infer(address: str, model: str, data: np.ndarray) -> dict[str, np.ndarray] | str:
    with grpcclient.InferenceServerClient(address) as client:
        infer_input = grpcclient.InferInput("IN", list(data.shape), "FP32")
        infer_input.set_data_from_numpy(data)
        try:
            result = client.infer(model, [infer_input])
        except InferenceServerException as exc:
            return f"{exc.status()} {exc.message()}"
        response = result.get_response()
        return {o.name: result.as_numpy(o.name) for o in response.outputs}


@pytest.mark.parametrize(
    ("model", "data"),
    [
        pytest.param("pipe", np.array([ROW], np.float32), id="pipeline"),
        pytest.param("dag", np.array([ROW, ROW], np.float32), id="two-branches"),
        pytest.param("failing", np.array([NEGATIVE], np.float32), id="step-fails"),
        pytest.param("ens_failarg", np.array([ROW], np.float32), id="step-invalid-arg"),
    ],
)
def test_the_same_answers_over_grpc(servers: Servers, model: str, data: np.ndarray):
    expected = _grpc_infer(servers.triton.grpc_address, model, data)
    actual = _grpc_infer(servers.zeroserve_grpc, model, data)

    if isinstance(expected, str):
        assert actual == expected
    else:
        assert isinstance(actual, dict) and actual.keys() == expected.keys()
        for name, array in expected.items():
            np.testing.assert_array_equal(actual[name], array)


def test_unloading_a_composing_model_takes_its_ensembles_out_until_it_is_back(servers: Servers):
    watched = {"scale3", "pipe", "counted", "nested", "dag", "failing"}

    def states() -> dict[str, str | None]:
        found = []
        for base in (servers.triton.http_url, servers.zeroserve.url):
            index = httpx.post(f"{base}/v2/repository/index", timeout=30.0).json()
            found.append(
                {
                    row["name"]: "UNAVAILABLE"
                    if row.get("state") == "UNLOADING"
                    else row.get("state")
                    for row in index
                    if row["name"] in watched
                }
            )
        assert found[1] == found[0]
        return found[0]

    _both(servers, "/v2/repository/models/scale3/unload")
    after_unload = states()
    assert after_unload["pipe"] == after_unload["nested"] == "UNAVAILABLE"
    assert after_unload["failing"] == "READY"
    _both(servers, "/v2/models/pipe/infer", {"inputs": [_fp32("IN", ROW, [1, 4])]})

    # zeroserve's answer to a load also says where the files came from; Triton's is empty.
    for base in (servers.triton.http_url, servers.zeroserve.url):
        assert _post(base, "/v2/repository/models/scale3/load")[0] == 200
    assert set(states().values()) == {"READY"}
    _both(servers, "/v2/models/nested/infer", {"inputs": [_fp32("X", ROW, [1, 4])]})
