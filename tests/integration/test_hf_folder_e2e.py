"""A plain Hugging Face folder (the tiny Llama as ``save_pretrained`` wrote it: no
config.pbtxt, no version folder) uploaded to a real moto_server S3, registered through the
admin API of a real ``zeroserve up`` with neither backend nor config, and answered from zero
by the official ``openai`` client through the activator. Everything started is stopped when
the test ends, whatever happened; every wait has a deadline."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.data_plane.storage.s3_server import REGION, MotoServer, start_moto
from tests.integration.test_platform_e2e import AUTH, Platform, start_platform
from tests.llm_model import prompt, write_hf_folder

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

WAIT_S = 120.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def moto(tmp_path: Path) -> Iterator[MotoServer]:
    (tmp_path / "moto").mkdir()
    server = start_moto(tmp_path / "moto")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(moto: MotoServer, tmp_path: Path) -> str:
    """The folder's files right under s3://<bucket>/hf/tiny/, as a user uploads one."""
    name = f"hf-{uuid.uuid4().hex[:12]}"
    s3 = moto.client()
    s3.create_bucket(Bucket=name)
    folder = write_hf_folder(tmp_path, "tiny")
    for path in sorted(folder.iterdir()):
        s3.put_object(Bucket=name, Key=f"hf/tiny/{path.name}", Body=path.read_bytes())
    return name


@pytest.fixture
def platform(moto: MotoServer, bucket: str, tmp_path: Path) -> Iterator[Platform]:
    started = start_platform(
        tmp_path / "platform",
        "hf",
        AWS_ENDPOINT_URL=moto.url,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION=REGION,
        ZEROSERVE_ALLOWED_STORAGE=f"s3://{bucket}",
    )
    try:
        yield started
    finally:
        started.stop()
        leftovers = started.wait_workers_gone()
        started.kill_leftovers()
        assert not leftovers, f"orphan workers {leftovers}"


async def test_a_hugging_face_folder_from_s3_answers_the_openai_client_from_zero(
    platform: Platform, bucket: str
) -> None:
    async with httpx.AsyncClient(timeout=WAIT_S) as http:
        registered = await http.post(
            f"{platform.admin}/admin/v1/models",
            json={
                "name": "tiny",
                "storage_uri": f"s3://{bucket}/hf/tiny",
                "scaling": {"min_replicas": 0, "idle_timeout_s": 600},
            },
            headers=AUTH,
        )
        assert registered.status_code == 201, registered.text
        assert registered.json()["status"]["state"] == "scaled_to_zero"

        async with openai.AsyncOpenAI(
            base_url=f"{platform.public}/v1", api_key="not-needed", max_retries=0, timeout=WAIT_S
        ) as client:
            completion = await client.completions.create(
                model="tiny", prompt=prompt("the", "fox", "dog"), max_tokens=6, temperature=0
            )
            chat = await client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "the fox"}],
                max_tokens=4,
                temperature=0,
            )
        assert completion.usage.prompt_tokens == 3
        assert completion.choices[0].text.strip()
        assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content

        [timeline, *_] = (
            await http.get(f"{platform.admin}/admin/v1/models/tiny/activations", headers=AUTH)
        ).json()["activations"]
        assert timeline["outcome"] == "ready" and timeline["cache"] == "miss"
        generated = await http.post(
            f"{platform.public}/v2/models/tiny/generate",
            json={"text_input": prompt("the", "fox", "dog"), "parameters": {"max_tokens": 6,
                  "temperature": 0}},
        )  # fmt: skip
        assert generated.status_code == 200, generated.text
        assert generated.json()["text_output"].endswith(completion.choices[0].text)
