"""Versions in URLs and folder names are ASCII digits: other scripts' digits name nothing.

``str.isdigit`` accepts ``'³'`` (which ``int`` refuses: a 500) and ``'١'``/``'１'`` (which
``int`` reads as 1: another version's answer). Triton's route pattern is ``[0-9]+``, so
such a path matches no route there: 404.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from foundation import model_config
from tests.data_plane.llm_app import llm_app
from tests.models import write_python_model

pytestmark = pytest.mark.anyio

UNICODE_DIGITS = [
    pytest.param("³", id="superscript-three"),
    pytest.param("١", id="arabic-indic-one"),
    pytest.param("１", id="fullwidth-one"),
]

_INFER_BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}


@pytest.mark.parametrize("digit", UNICODE_DIGITS)
async def test_every_version_route_answers_404(tmp_path: Path, digit: str) -> None:
    write_python_model(tmp_path / "repo", "m")
    async with llm_app(tmp_path / "repo", tmp_path / "cache", models=("m",)) as server:
        client = server.client
        assert (await client.get("/v2/models/m/versions/1/ready")).status_code == 200
        base = f"/v2/models/m/versions/{digit}"
        responses = [
            *[await client.get(base + suffix) for suffix in ("", "/ready", "/config", "/stats")],
            await client.post(base + "/infer", json=_INFER_BODY),
            await client.post(base + "/generate", json={"text_input": "hi"}),
        ]

        for response in responses:
            assert response.status_code == 404, (response.request.url, response.text)
            assert response.json() == {"error": "Not Found"}


@pytest.mark.parametrize("digit", UNICODE_DIGITS)
async def test_a_version_folder_named_with_other_digits_is_not_a_version(
    tmp_path: Path, digit: str
) -> None:
    model_dir = write_python_model(tmp_path / "repo", "m")
    (model_dir / "1").rename(model_dir / digit)
    async with llm_app(tmp_path / "repo", tmp_path / "cache", models=()) as server:
        response = await server.client.post("/v2/repository/models/m/load", json={})

        assert response.status_code == 400
        assert "no model here" in response.json()["error"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("0", True, id="zero"),
        pytest.param("12", True, id="ascii"),
        pytest.param("", False, id="empty"),
        pytest.param("1\n", False, id="trailing-newline"),
        pytest.param("-1", False, id="negative"),
        *[pytest.param(p.values[0], False, id=p.id) for p in UNICODE_DIGITS],
    ],
)
def test_is_version(text: str, expected: bool) -> None:
    assert model_config.is_version(text) is expected
