"""A load that fails on the model's store: for good (400) or for a passing reason (503).

The control plane tells the two apart by the worker's status: a 4xx marks the model
failed and stops activations, a 503 is retried after a backoff.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from data_plane.errors import ModelPollError, ModelStorageUnavailableError
from data_plane.http_errors import from_error
from data_plane.repository import ModelRepository, RepositorySettings
from data_plane.storage import (
    CachedModel,
    CacheFullError,
    StorageError,
    StorageNotFoundError,
    StorageTimeoutError,
    StorageUnavailableError,
    StorageUri,
    parse_storage_uri,
)
from runtimes.base import RuntimeOptions
from runtimes.registry import RuntimeFactory

pytestmark = pytest.mark.anyio


class _FailingCache:
    """A node cache whose every fetch fails with ``error``."""

    def __init__(self, error: StorageError) -> None:
        self.error = error

    async def fetch(self, uri: StorageUri, *, model: str) -> CachedModel:
        raise self.error

    async def list_models(self, uri: StorageUri) -> list[str]:
        return []


def _repository(tmp_path: Path, error: StorageError) -> ModelRepository:
    settings = RepositorySettings(
        root=parse_storage_uri(str(tmp_path), allowed=[str(tmp_path)]),
        allowed_storage=(str(tmp_path),),
        gpu_count=0,
        batcher_queue_bound=8,
        drain_timeout_s=1.0,
    )
    return ModelRepository(
        settings,
        _FailingCache(error),  # type: ignore[arg-type]
        RuntimeFactory(RuntimeOptions()),
    )


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(
            StorageUnavailableError(uri="s3://b/m", reason="cannot reach the store"),
            id="unreachable",
        ),
        pytest.param(
            StorageTimeoutError(uri="s3://b/m", reason="the store did not answer in time"),
            id="timeout",
        ),
        pytest.param(CacheFullError(uri="s3://b/m", reason="loaded models pin it"), id="full"),
    ],
)
async def test_a_passing_storage_failure_is_a_503_with_retry_after(
    tmp_path: Path, error: StorageError
):
    repository = _repository(tmp_path, error)
    with pytest.raises(ModelStorageUnavailableError) as raised:
        await repository.load("m")
    assert isinstance(raised.value, ModelPollError)  # still a load failure, worded as one
    assert raised.value.message == (
        f"failed to load 'm', failed to poll from model repository: {error.message}"
    )
    response = from_error(raised.value)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "5"


async def test_a_missing_model_is_a_400(tmp_path: Path):
    error = StorageNotFoundError(uri="s3://b/m", reason="no such object (404)")
    repository = _repository(tmp_path, error)
    with pytest.raises(ModelPollError) as raised:
        await repository.load("m")
    assert not isinstance(raised.value, ModelStorageUnavailableError)
    assert from_error(raised.value).status_code == 400
