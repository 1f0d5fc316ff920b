"""A load's answer says where the model's files came from: the node cache (``hit``), a
download (``miss``, with the bytes fetched), or a local folder read in place (``local``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.data_plane.server_app import data_plane
from tests.data_plane.storage.s3_server import CREDENTIALS, REGION, MotoServer, start_moto
from tests.models import write_onnx_mlp

pytestmark = pytest.mark.anyio

BUCKET = "load-report"


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = start_moto(tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.stop()


async def test_a_local_folder_is_read_in_place(tmp_path: Path):
    repo = tmp_path / "repo"
    write_onnx_mlp(repo, "mlp")
    async with data_plane(repo, tmp_path / "cache") as client:
        response = await client.post("/v2/repository/models/mlp/load")
        assert response.status_code == 200, response.text
        report = response.json()
        assert report["cache"] == "local"
        assert report["bytes_fetched"] == 0
        assert report["fetch_s"] >= 0
        # A load that downloads nothing (and one that is over) has no progress to show.
        progress = await client.get("/v2/repository/models/mlp/progress")
        assert progress.status_code == 200
        assert progress.json() == {
            "name": "mlp",
            "fetching": False,
            "bytes_fetched": None,
            "bytes_total": None,
        }


async def test_s3_first_load_misses_and_the_next_one_hits(
    tmp_path: Path, moto: MotoServer, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDENTIALS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    model_dir = write_onnx_mlp(tmp_path / "local", "mlp")
    s3 = moto.client()
    s3.create_bucket(Bucket=BUCKET)
    size = 0
    for path in model_dir.rglob("*"):
        if path.is_file() and path.name != "weights.npz":
            s3.put_object(
                Bucket=BUCKET,
                Key=f"models/mlp/{path.relative_to(model_dir)}",
                Body=path.read_bytes(),
            )
            size += path.stat().st_size
    body = {"parameters": {"storage_uri": f"s3://{BUCKET}/models/mlp"}}
    empty = tmp_path / "empty"
    empty.mkdir()
    async with data_plane(empty, tmp_path / "cache", allowed_storage=(f"s3://{BUCKET}",)) as client:
        first = await client.post("/v2/repository/models/mlp/load", json=body)
        assert first.status_code == 200, first.text
        assert first.json()["cache"] == "miss"
        assert first.json()["bytes_fetched"] == size
        assert (await client.post("/v2/repository/models/mlp/unload")).status_code == 200
        second = await client.post("/v2/repository/models/mlp/load", json=body)
        assert second.status_code == 200, second.text
        assert second.json()["cache"] == "hit"
        assert second.json()["bytes_fetched"] == 0
