"""boto3 failures become storage errors that say why; the client honours the AWS endpoint
variables and the cache's transfer settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from botocore import exceptions as bx

from data_plane.storage import (
    CacheSettings,
    StorageAccessDeniedError,
    StorageCorruptError,
    StorageError,
    StorageNotFoundError,
    StorageTimeoutError,
    StorageUnavailableError,
    create_s3_client,
)
from data_plane.storage.errors import StorageNotAllowedError
from data_plane.storage.s3 import translate_error


def _client_error(code: str, status: int, message: str = "") -> bx.ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return bx.ClientError(response, "GetObject")


@pytest.mark.parametrize(
    ("error", "kind", "reason"),
    [
        pytest.param(
            _client_error("NoSuchBucket", 404), StorageNotFoundError, "bucket", id="bucket"
        ),
        pytest.param(_client_error("NoSuchKey", 404), StorageNotFoundError, "404", id="key"),
        pytest.param(_client_error("404", 404), StorageNotFoundError, "404", id="head-404"),
        pytest.param(
            _client_error("AccessDenied", 403, "nope"),
            StorageAccessDeniedError,
            "access denied \\(AccessDenied: nope\\)",
            id="denied",
        ),
        pytest.param(_client_error("403", 403), StorageAccessDeniedError, "credentials", id="403"),
        pytest.param(
            _client_error("PreconditionFailed", 412), StorageUnavailableError, "changed", id="412"
        ),
        pytest.param(_client_error("SlowDown", 503), StorageUnavailableError, "SlowDown", id="503"),
        pytest.param(
            _client_error("InternalError", 500),
            StorageUnavailableError,
            "answered InternalError",
            id="5xx",
        ),
        pytest.param(_client_error("Weird", 400, "odd"), StorageError, "Weird: odd", id="other"),
        pytest.param(
            bx.ReadTimeoutError(endpoint_url="http://s3"), StorageTimeoutError, "in time", id="read"
        ),
        pytest.param(
            bx.ConnectTimeoutError(endpoint_url="http://s3"),
            StorageTimeoutError,
            "in time",
            id="connect",
        ),
        pytest.param(
            bx.EndpointConnectionError(endpoint_url="http://s3"),
            StorageUnavailableError,
            "cannot reach",
            id="unreachable",
        ),
        pytest.param(
            bx.IncompleteReadError(actual_bytes=1, expected_bytes=2),
            StorageCorruptError,
            "truncated",
            id="truncated",
        ),
        pytest.param(bx.NoCredentialsError(), StorageAccessDeniedError, "credentials", id="creds"),
        pytest.param(
            bx.ParamValidationError(report="bad"), StorageNotAllowedError, "bad", id="params"
        ),
        pytest.param(RuntimeError("boom"), StorageError, "RuntimeError: boom", id="unknown"),
    ],
)
def test_translate_error(error: Exception, kind: type[StorageError], reason: str) -> None:
    translated = translate_error(error, uri="s3://b/k")
    assert type(translated) is kind
    assert translated.message.startswith("cannot fetch 's3://b/k': ")
    assert re.search(reason, translated.message), translated.message


def test_client_uses_aws_endpoint_variables_and_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    settings = CacheSettings(root=tmp_path, max_bytes=1, concurrency=5, read_timeout_s=7.0)
    client = create_s3_client(settings)
    try:
        assert client.meta.endpoint_url == "http://127.0.0.1:9"
        assert client.meta.config.read_timeout == 7.0
        assert client.meta.config.max_pool_connections == 7
    finally:
        client.close()


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_bytes": 0},
        {"part_size_bytes": 1024},
        {"concurrency": 0},
        {"read_timeout_s": 0},
        {"max_attempts": 0},
    ],
)
def test_settings_ranges(tmp_path: Path, overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        CacheSettings(root=tmp_path, **{"max_bytes": 1, **overrides})
