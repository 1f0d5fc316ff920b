"""Generated requests against the data plane in process: no 5xx, no slow answer.

Schemathesis draws requests from the Open Inference Protocol's REST document (a copy of the
KServe one in tests/data/) and hypothesis draws near-valid infer bodies aimed at real ONNX
models, the inputs a hostile client tries first: odd and huge shapes, wrong datatypes,
mismatched data, NaN, Unicode versions. A bounded, derandomized number of examples keeps the
run short and repeatable in CI.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, strategies as st

from tests.data_plane.llm_app import llm_app
from tests.fuzzing import FUZZ, FuzzClient, cases, operations, serving
from tests.models import write_onnx_add_sub, write_onnx_mlp

SPEC = Path(__file__).resolve().parents[1] / "data" / "open_inference_rest.yaml"
MODELS = ("mlp", "addsub")
VERSIONS = ("1", "", "2", "0", "-1", "01", "³", "١", "１", "99999999999999999999")
DATATYPES = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "BYTES", "fp32", "", "FP128",
)  # fmt: skip
HUGE = (2**31, 2**32, 2**53, 2**63 - 1, 2**63, 2**64, 10**30)


def _spec() -> dict[str, Any]:
    # The document writes path templates as ``${NAME}``; OpenAPI's are ``{NAME}``.
    document: dict[str, Any] = yaml.safe_load(SPEC.read_text().replace("${", "{"))
    return document


OPERATIONS = operations(_spec())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzClient]:
    root = tmp_path_factory.mktemp("fuzz")
    repo = root / "repo"
    write_onnx_mlp(repo, "mlp")
    write_onnx_add_sub(repo, "addsub")
    with serving(llm_app(repo, root / "cache", models=MODELS)) as client:
        yield client


def _at_a_model(draw: st.DrawFn, case: Any) -> None:
    """Half of the cases with path names go to a served model, at a drawn version."""
    if case.path_parameters and draw(st.booleans()):
        case.path_parameters["MODEL_NAME"] = draw(st.sampled_from(MODELS))
        case.path_parameters["MODEL_VERSION"] = draw(st.sampled_from(VERSIONS))


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: f"{op.method} {op.path}")
def test_generated_requests_get_no_5xx(server: FuzzClient, operation: Any) -> None:
    @FUZZ
    @given(request=cases(operation, _at_a_model, "http://data-plane"))
    def check(request: dict[str, Any]) -> None:
        server.send(**request)

    check()


_scalars = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=8),
    st.none(),
)
_data = st.recursive(
    st.lists(_scalars, max_size=8), lambda inner: st.lists(inner, max_size=4), max_leaves=32
)
_dims = st.one_of(st.integers(min_value=-3, max_value=20), st.sampled_from(HUGE))
_shapes = st.one_of(
    st.lists(_dims, max_size=6),
    st.lists(st.sampled_from([0, 1]), min_size=60, max_size=80),  # more dims than numpy holds
    st.lists(st.sampled_from([0, *HUGE]), min_size=1, max_size=3),  # zero elements, huge dims
    st.just("1,16"),
)


@st.composite
def _infer(draw: st.DrawFn) -> dict[str, Any]:
    model = draw(st.sampled_from(MODELS))
    names = ("INPUT0", "INPUT1") if model == "addsub" else ("INPUT0",)
    tensor = {
        "name": draw(st.sampled_from((*names, "nope", ""))),
        "shape": draw(_shapes),
        # The right datatype and empty data half of the time each, so shapes reach numpy.
        "datatype": draw(st.one_of(st.just("FP32"), st.sampled_from(DATATYPES))),
        "data": draw(st.one_of(st.just([]), _data)),
    }
    if draw(st.booleans()):
        tensor["parameters"] = {"binary_data_size": draw(_dims)}
    body: dict[str, Any] = {"inputs": [tensor] * draw(st.integers(min_value=0, max_value=2))}
    if draw(st.booleans()):
        body["outputs"] = [{"name": draw(st.sampled_from(("OUTPUT0", "OUTPUT1", "x")))}]
    version = draw(st.sampled_from(VERSIONS))
    path = (
        f"/v2/models/{model}/versions/{version}/infer" if version else f"/v2/models/{model}/infer"
    )
    return {"method": "POST", "url": path, "json": body}


def test_near_valid_infer_bodies_get_no_5xx(server: FuzzClient) -> None:
    @FUZZ
    @given(request=_infer())
    def check(request: dict[str, Any]) -> None:
        server.send(**request)

    check()


def test_the_fuzzed_server_still_answers_good_requests(server: FuzzClient) -> None:
    """Runs last in the module: nothing the generated requests did broke the models."""
    body = {
        "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]
    }
    response = server.send(method="POST", url="/v2/models/mlp/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["shape"] == [1, 8]
