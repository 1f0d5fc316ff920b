"""Registration checks of models in S3, against a real moto_server: a listing, small GETs,
and an ONNX file's interface read by a few ranged GETs, never the whole weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from control_plane.errors import InvalidRegistrationError, RegistrationCheckUnavailableError
from control_plane.inspection.inspector import RegistrationInspector
from foundation.records import ModelRecord
from tests.data_plane.storage.s3_server import CREDENTIALS, REGION, MotoServer, start_moto
from tests.integration.conftest import free_port
from tests.models import make_config, write_config, write_onnx_mlp

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

BUCKET = "models"
WIDE = (256, 2048, 8)
"""An MLP whose weights (about 2 MiB, inside model.onnx) lie before its graph's inputs."""


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = start_moto(tmp_path_factory.mktemp("moto"))
    try:
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()


def _upload(moto: MotoServer, folder: Path, prefix: str) -> str:
    client = moto.client()
    for path in folder.rglob("*"):
        if path.is_file() and path.name != "weights.npz":
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
    return f"s3://{BUCKET}/{prefix}"


def _inspector(endpoint: str, **client: object) -> RegistrationInspector:
    def make_client() -> object:
        return boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=REGION,
            config=Config(**client),
            **CREDENTIALS,
        )

    return RegistrationInspector(
        allowed_storage=(f"s3://{BUCKET}",),
        allow_model_code=True,
        pool_of=lambda record: ("default", None),
        timeout_s=60.0,
        s3_client_factory=make_client,
    )


async def test_a_good_model_passes_reading_its_graph_with_a_few_ranged_gets(
    moto: MotoServer, tmp_path: Path
):
    folder = write_onnx_mlp(tmp_path, "wide", WIDE)
    assert (folder / "1" / "model.onnx").stat().st_size > 2_000_000
    uri = _upload(moto, folder, "good/wide")
    before = moto.object_gets(BUCKET, "good/wide/1/model.onnx")
    inspector = _inspector(moto.url)
    try:
        await inspector.check(ModelRecord(name="wide", storage_uri=uri))
    finally:
        inspector.close()
    gets = moto.object_gets(BUCKET, "good/wide/1/model.onnx") - before
    # One 64 KiB block per hop over a weight tensor, and the block holding the inputs.
    assert 1 <= gets <= 8


async def test_an_input_the_graph_lacks_is_refused(moto: MotoServer, tmp_path: Path):
    folder = write_onnx_mlp(tmp_path, "bogus", WIDE)
    write_config(
        folder,
        make_config(
            "bogus",
            backend="onnxruntime",
            inputs=[("not_an_input", "FP32", [WIDE[0]])],
            outputs=[("OUTPUT0", "FP32", [WIDE[-1]])],
        ),
    )
    uri = _upload(moto, folder, "bad/bogus")
    inspector = _inspector(moto.url)
    try:
        with pytest.raises(InvalidRegistrationError) as raised:
            await inspector.check(ModelRecord(name="bogus", storage_uri=uri))
    finally:
        inspector.close()
    assert "configuration input 'not_an_input' is not a model input" in raised.value.message
    assert "model inputs: ['INPUT0']" in raised.value.message


async def test_a_missing_prefix_and_a_broken_config_are_refused(moto: MotoServer, tmp_path: Path):
    folder = write_onnx_mlp(tmp_path, "unparsable")
    (folder / "config.pbtxt").write_text('backend: "onnxruntime"\ninput [ {\n')
    uri = _upload(moto, folder, "bad/unparsable")
    inspector = _inspector(moto.url)
    try:
        with pytest.raises(InvalidRegistrationError) as missing:
            await inspector.check(ModelRecord(name="m", storage_uri=f"s3://{BUCKET}/nothing"))
        with pytest.raises(InvalidRegistrationError) as broken:
            await inspector.check(ModelRecord(name="m", storage_uri=uri))
    finally:
        inspector.close()
    assert missing.value.message == (
        "failed to load 'm', failed to poll from model repository: cannot fetch "
        f"'s3://{BUCKET}/nothing': no object 'nothing' and no objects under 'nothing/'"
    )
    assert broken.value.message.startswith(
        "failed to load 'm', failed to poll from model repository: "
    )


async def test_an_unreachable_store_is_a_check_to_retry_not_a_refusal():
    inspector = _inspector(
        f"http://127.0.0.1:{free_port()}",
        connect_timeout=1,
        retries={"max_attempts": 1, "mode": "standard"},
    )
    try:
        with pytest.raises(RegistrationCheckUnavailableError) as raised:
            await inspector.check(ModelRecord(name="m", storage_uri=f"s3://{BUCKET}/m"))
    finally:
        inspector.close()
    assert raised.value.retry_after_s > 0
    assert "cannot check model 'm' now" in raised.value.message
