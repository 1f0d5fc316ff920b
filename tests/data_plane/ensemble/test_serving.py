"""Ensembles served by the data plane's HTTP app, in process, over zeroserve Python models
and ONNX models: pipelines, branches, ensembles of ensembles, failing steps, loading and
unloading with the composing models, statistics, batching at a composing model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import json_format

from data_plane.settings import ModelControlMode
from foundation.proto import model_config_pb2 as mc
from tests.data_plane.ensemble.ensembles import ensemble_config, step, write_ensemble
from tests.data_plane.ensemble.models import CLASSES, PIXELS, classify_reference, write_repository
from tests.data_plane.server_app import data_plane

pytestmark = pytest.mark.anyio

RNG = np.random.default_rng(7)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return write_repository(tmp_path / "repo")


def tensor(name: str, array: np.ndarray, datatype: str) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(array.shape),
        "data": array.ravel().tolist(),
    }


def outputs_of(response: httpx.Response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in response.json()["outputs"]}


async def load(client: httpx.AsyncClient, name: str) -> httpx.Response:
    return await client.post(f"/v2/repository/models/{name}/load")


async def index(client: httpx.AsyncClient) -> dict[str, str]:
    rows = (await client.post("/v2/repository/index")).json()
    return {row["name"]: row["state"] for row in rows if "state" in row}


async def test_a_pre_model_post_pipeline_answers_as_its_three_models_in_a_row(repo, tmp_path):
    image = RNG.integers(0, 256, size=(3, PIXELS), dtype=np.uint8)
    async with data_plane(repo, tmp_path / "cache") as client:
        assert (await load(client, "classify")).status_code == 200

        response = await client.post(
            "/v2/models/classify/infer",
            json={"id": "c1", "inputs": [tensor("IMAGE", image, "UINT8")]},
        )

        labels, probabilities = classify_reference(repo, image)
        answer = outputs_of(response)
        np.testing.assert_array_equal(answer["LABEL"], labels)
        np.testing.assert_allclose(answer["PROB"], probabilities, rtol=1e-5, atol=1e-6)
        body = response.json()
        assert (body["model_name"], body["model_version"], body["id"]) == ("classify", "1", "c1")
        assert [(o["name"], o["datatype"], o["shape"]) for o in body["outputs"]] == [
            ("LABEL", "INT64", [3, 1]),
            ("PROB", "FP32", [3, CLASSES]),
        ]


async def test_loading_an_ensemble_loads_its_composing_models(repo, tmp_path):
    async with data_plane(repo, tmp_path / "cache") as client:
        assert await index(client) == {}

        await load(client, "outer")

        assert await index(client) == dict.fromkeys(
            ["classify", "mlp", "negate", "outer", "post", "pre"], "READY"
        )
        metadata = (await client.get("/v2/models/outer")).json()
        assert metadata == {
            "name": "outer",
            "versions": ["1"],
            "platform": "ensemble",
            "inputs": [{"name": "IMAGE", "datatype": "UINT8", "shape": [-1, PIXELS]}],
            "outputs": [
                {"name": "LABEL", "datatype": "INT64", "shape": [-1, 1]},
                {"name": "NEG", "datatype": "FP32", "shape": [-1, CLASSES]},
            ],
        }


async def test_two_branches_run_side_by_side_and_join(repo, tmp_path):
    data = RNG.standard_normal((2, PIXELS)).astype(np.float32)
    async with data_plane(repo, tmp_path / "cache", load_models=("branches",)) as client:
        response = await client.post(
            "/v2/models/branches/infer", json={"inputs": [tensor("IN", data, "FP32")]}
        )

        answer = outputs_of(response)
        np.testing.assert_allclose(answer["SUM"], data * 5, rtol=1e-6)
        np.testing.assert_allclose(answer["DIFF"], -data, rtol=1e-6)


async def test_an_ensemble_of_ensembles_with_requested_outputs(repo, tmp_path):
    image = RNG.integers(0, 256, size=(2, PIXELS), dtype=np.uint8)
    async with data_plane(repo, tmp_path / "cache", load_models=("outer",)) as client:
        response = await client.post(
            "/v2/models/outer/infer",
            json={"inputs": [tensor("IMAGE", image, "UINT8")], "outputs": [{"name": "NEG"}]},
        )

        _, probabilities = classify_reference(repo, image)
        answer = outputs_of(response)
        assert list(answer) == ["NEG"]
        np.testing.assert_allclose(answer["NEG"], -probabilities, rtol=1e-5, atol=1e-6)


async def test_binary_outputs_of_an_ensemble(repo, tmp_path):
    image = RNG.integers(0, 256, size=(1, PIXELS), dtype=np.uint8)
    infer_input = httpclient.InferInput("IMAGE", list(image.shape), "UINT8")
    infer_input.set_data_from_numpy(image, binary_data=True)
    body, header_length = httpclient.InferenceServerClient.generate_request_body(
        [infer_input], outputs=[httpclient.InferRequestedOutput("PROB", binary_data=True)]
    )
    async with data_plane(repo, tmp_path / "cache", load_models=("classify",)) as client:
        response = await client.post(
            "/v2/models/classify/infer",
            content=body,
            headers={"Inference-Header-Content-Length": str(header_length)},
        )

        assert response.status_code == 200, response.text
        result = httpclient.InferenceServerClient.parse_response_body(
            response.content,
            header_length=int(response.headers["Inference-Header-Content-Length"]),
        )
        _, probabilities = classify_reference(repo, image)
        np.testing.assert_allclose(result.as_numpy("PROB"), probabilities, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("model", "body", "status", "error"),
    [
        pytest.param(
            "guarded",
            {"inputs": [tensor("IN", -np.ones((1, PIXELS), np.float32), "FP32")]},
            400,
            "in ensemble 'guarded', negative input",
            id="step-refuses",
        ),
        pytest.param(
            "shapeless",
            {"id": "s1", "inputs": [tensor("IN", np.ones((1, 5), np.float32), "FP32")]},
            400,
            "in ensemble 'shapeless', [request id: s1] unexpected shape for input 'INPUT0' for "
            "model 'mlp'. Expected [-1,16], got [1,5]. NOTE: Setting a non-zero max_batch_size "
            "in the model config requires a batch dimension to be prepended to each input "
            "shape. If you want to specify the full shape including the batch dim in your "
            "input dims config, try setting max_batch_size to zero. See the model "
            "configuration docs for allowed inference request shapes.",
            id="step-validation",
        ),
        pytest.param(
            "guarded",
            {"inputs": [tensor("IN", np.ones((1, 5), np.float32), "FP32")]},
            400,
            "[request id: <id_unknown>] unexpected shape for input 'IN' for model 'guarded'. "
            "Expected [-1,16], got [1,5]. NOTE: Setting a non-zero max_batch_size in the model "
            "config requires a batch dimension to be prepended to each input shape. If you "
            "want to specify the full shape including the batch dim in your input dims config, "
            "try setting max_batch_size to zero. See the model configuration docs for allowed "
            "inference request shapes.",
            id="ensemble-validation",
        ),
    ],
)
async def test_errors_name_the_ensemble_as_triton_does(repo, tmp_path, model, body, status, error):
    async with data_plane(repo, tmp_path / "cache", load_models=(model,)) as client:
        response = await client.post(f"/v2/models/{model}/infer", json=body)

        assert (response.status_code, response.json()) == (status, {"error": error})


async def test_a_nested_failure_names_every_ensemble_on_the_way(repo, tmp_path):
    write_ensemble(
        repo,
        ensemble_config(
            "wrapper",
            [step("guarded", {"IN": "X"}, {"OUT": "Y"})],
            [("X", "FP32", [PIXELS])],
            [("Y", "FP32", [PIXELS])],
        ),
    )
    async with data_plane(repo, tmp_path / "cache", load_models=("wrapper",)) as client:
        response = await client.post(
            "/v2/models/wrapper/infer",
            json={"inputs": [tensor("X", -np.ones((1, PIXELS), np.float32), "FP32")]},
        )

        assert response.status_code == 400
        assert response.json() == {
            "error": "in ensemble 'wrapper', in ensemble 'guarded', negative input"
        }


async def test_statistics_of_the_ensemble_and_of_its_composing_models(repo, tmp_path):
    image = RNG.integers(0, 256, size=(2, PIXELS), dtype=np.uint8)
    async with data_plane(repo, tmp_path / "cache", load_models=("classify",)) as client:
        for _ in range(3):
            outputs_of(
                await client.post(
                    "/v2/models/classify/infer", json={"inputs": [tensor("IMAGE", image, "UINT8")]}
                )
            )
        await client.post(
            "/v2/models/classify/infer", json={"inputs": [tensor("IMAGE", image, "FP32")]}
        )

        (ensemble,) = (await client.get("/v2/models/classify/stats")).json()["model_stats"]
        (mlp,) = (await client.get("/v2/models/mlp/stats")).json()["model_stats"]

        stats = ensemble["inference_stats"]
        assert (ensemble["inference_count"], ensemble["execution_count"]) == (6, 3)
        assert (stats["success"]["count"], stats["fail"]["count"]) == (3, 1)
        for kind in ("queue", "compute_input", "compute_infer", "compute_output"):
            assert stats[kind]["count"] == 3
        # Triton's ensemble compute times are its steps' summed: within its own time.
        compute = sum(stats[k]["ns"] for k in ("compute_input", "compute_infer", "compute_output"))
        assert 0 < stats["compute_infer"]["ns"] and compute <= stats["success"]["ns"]
        assert [b["batch_size"] for b in ensemble["batch_stats"]] == [2]
        assert ensemble["batch_stats"][0]["compute_infer"] == stats["compute_infer"]
        assert mlp["inference_count"] == 6
        assert mlp["inference_stats"]["success"]["count"] == 3


async def test_concurrent_ensemble_requests_are_batched_at_the_composing_model(tmp_path):
    batching = mc.ModelDynamicBatching(
        preferred_batch_size=[4], max_queue_delay_microseconds=10_000_000
    )
    repo = write_repository(tmp_path / "repo", mlp_batching=batching)
    image = RNG.integers(0, 256, size=(1, PIXELS), dtype=np.uint8)
    async with data_plane(repo, tmp_path / "cache", load_models=("classify",)) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    "/v2/models/classify/infer", json={"inputs": [tensor("IMAGE", image, "UINT8")]}
                )
                for _ in range(4)
            )
        )

        for response in responses:
            outputs_of(response)
        (mlp,) = (await client.get("/v2/models/mlp/stats")).json()["model_stats"]
        assert [(b["batch_size"], b["compute_infer"]["count"]) for b in mlp["batch_stats"]] == [
            (4, 1)
        ]


async def test_unloading_a_composing_model_takes_its_ensembles_out_until_it_is_back(repo, tmp_path):
    image = RNG.integers(0, 256, size=(1, PIXELS), dtype=np.uint8)
    request = {"inputs": [tensor("IMAGE", image, "UINT8")]}
    async with data_plane(repo, tmp_path / "cache", load_models=("outer",)) as client:
        assert (await client.post("/v2/repository/models/mlp/unload")).status_code == 200

        states = await index(client)
        assert {states[n] for n in ("mlp", "classify", "outer")} == {"UNAVAILABLE"}
        assert states["pre"] == "READY"
        gone = await client.post("/v2/models/outer/infer", json=request)
        assert gone.status_code == 404

        assert (await load(client, "mlp")).status_code == 200

        assert {(await index(client))[n] for n in ("mlp", "classify", "outer")} == {"READY"}
        outputs_of(await client.post("/v2/models/outer/infer", json=request))


async def test_unloading_an_ensemble_leaves_its_composing_models_serving(repo, tmp_path):
    async with data_plane(repo, tmp_path / "cache", load_models=("classify",)) as client:
        await client.post("/v2/repository/models/classify/unload")
        await client.post("/v2/repository/models/mlp/unload")
        await load(client, "mlp")

        states = await index(client)
        assert (states["classify"], states["mlp"], states["pre"]) == (
            "UNAVAILABLE",
            "READY",
            "READY",
        )


async def test_the_config_of_an_ensemble_as_triton_prints_it(repo, tmp_path):
    async with data_plane(repo, tmp_path / "cache", load_models=("branches",)) as client:
        config = (await client.get("/v2/models/branches/config")).json()

        assert config["platform"] == "ensemble"
        assert config.get("instance_group", []) == []
        assert "optimization" not in config
        assert "dynamic_batching" not in config
        assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == [
            "double",
            "triple",
            "add_sub",
        ]
        assert config["ensemble_scheduling"]["step"][0]["model_version"] == -1
        # A field of later Triton versions, which 2.51 does not print.
        assert "max_inflight_requests" not in config["ensemble_scheduling"]


def _bad(repo: Path, name: str, steps, inputs=None, outputs=None) -> None:
    write_ensemble(
        repo,
        ensemble_config(
            name,
            steps,
            inputs or [("IN", "FP32", [PIXELS])],
            outputs or [("OUT", "FP32", [PIXELS])],
        ),
    )


async def test_bad_ensembles_fail_to_load_with_tritons_texts_and_the_server_stays_ready(
    repo, tmp_path
):
    _bad(repo, "missing", [step("nosuch", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})])
    _bad(repo, "old_version", [step("double", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}, version=7)])
    _bad(
        repo,
        "wrong_type",
        [step("double", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})],
        inputs=[("IN", "INT32", [PIXELS])],
    )
    _bad(repo, "cyc_a", [step("cyc_b", {"IN": "IN"}, {"OUT": "OUT"})])
    _bad(repo, "cyc_b", [step("cyc_a", {"IN": "IN"}, {"OUT": "OUT"})])
    _bad(
        repo,
        "unused",
        [step("double", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})],
        inputs=[("IN", "FP32", [PIXELS]), ("EXTRA", "FP32", [PIXELS])],
    )
    expected = {
        "missing": "load failed for model 'missing': ensemble missing contains models that are "
        "not available or ambiguous: nosuch\n",
        "old_version": "load failed for model 'old_version': ensemble 'old_version' depends on "
        "'double' whose required version 7 is not loaded.\n",
        "wrong_type": "load failed for model 'wrong_type': in ensemble wrong_type, ensemble "
        "tensor IN: inconsistent data type: TYPE_INT32 is inferred from model wrong_type while "
        "TYPE_FP32 is inferred from model double\n",
        "cyc_a": "load failed for model 'cyc_a': circular dependency between ensembles: cyc_a "
        "-> ... -> cyc_b -> cyc_a\n",
    }
    async with data_plane(repo, tmp_path / "cache", load_models=("guarded",)) as client:
        for name, error in expected.items():
            response = await load(client, name)
            assert (response.status_code, response.json()) == (400, {"error": error}), name
        unused = await load(client, "unused")
        assert "ensemble input 'EXTRA' for ensemble unused' is not used" in unused.json()["error"]

        assert (await client.get("/v2/health/ready")).status_code == 200
        states = await index(client)
        assert not {"missing", "old_version", "wrong_type", "cyc_a", "cyc_b"} & set(states)
        assert states["guarded"] == "READY"


async def test_an_ensemble_missing_a_model_at_start_keeps_the_server_unready(repo, tmp_path):
    _bad(repo, "missing", [step("nosuch", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})])
    async with data_plane(repo, tmp_path / "cache", mode=ModelControlMode.NONE) as client:
        assert (await client.get("/v2/health/ready")).status_code != 200
        assert (await client.get("/v2/models/missing/ready")).status_code != 200
        assert (await client.get("/v2/models/classify/ready")).status_code == 200


async def test_a_config_override_can_make_a_model_an_ensemble(repo, tmp_path):
    config = ensemble_config(
        "guarded",
        [step("triple", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})],
        [("IN", "FP32", [PIXELS])],
        [("OUT", "FP32", [PIXELS])],
    )
    override = json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))
    data = np.ones((1, PIXELS), np.float32)
    async with data_plane(repo, tmp_path / "cache") as client:
        loaded = await client.post(
            "/v2/repository/models/guarded/load", json={"parameters": {"config": override}}
        )
        assert loaded.status_code == 200, loaded.text

        answer = outputs_of(
            await client.post(
                "/v2/models/guarded/infer", json={"inputs": [tensor("IN", data, "FP32")]}
            )
        )
        np.testing.assert_allclose(answer["OUT"], data * 3)
