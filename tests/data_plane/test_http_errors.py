from __future__ import annotations

import json

import pytest

from data_plane import errors
from data_plane.http_errors import from_error, status_for


@pytest.mark.parametrize(
    ("error", "status", "retry_after"),
    [
        pytest.param(errors.InvalidArgumentError("bad"), 400, False, id="invalid-argument"),
        pytest.param(errors.UnknownModelError(model="m"), 404, False, id="unknown-model"),
        pytest.param(errors.NotFoundError("gone"), 404, False, id="not-found"),
        pytest.param(errors.ModelNotReadyError("wait"), 503, True, id="not-ready"),
        pytest.param(errors.QueueFullError(request_id="7"), 503, True, id="queue-full"),
        pytest.param(errors.RequestTimeoutError(), 503, True, id="queue-timeout"),
        pytest.param(errors.ServerStoppingError(), 503, True, id="stopping"),
        pytest.param(errors.UnsupportedError("no"), 501, False, id="unsupported"),
        pytest.param(errors.ModelLoadError(model="m", reason="r"), 400, False, id="load-failed"),
        pytest.param(errors.ModelPollError(model="m", reason="r"), 400, False, id="poll-failed"),
        pytest.param(errors.InternalError("boom"), 500, False, id="internal"),
        pytest.param(errors.ZeroserveError("other"), 500, False, id="base"),
    ],
)
def test_each_error_maps_to_its_status_and_json_body(error, status: int, retry_after: bool):
    assert status_for(error) == status
    response = from_error(error)
    assert response.status_code == status
    assert response.media_type == "application/json"
    assert json.loads(bytes(response.body)) == {"error": error.message}
    assert ("retry-after" in response.headers) is retry_after


def test_triton_texts():
    assert (
        errors.QueueFullError(request_id="7").message
        == "[request id: 7] Exceeds maximum queue size"
    )
    assert (
        errors.RequestTimeoutError().message == "[request id: <id_unknown>] Request timeout expired"
    )
    assert errors.UnknownModelError(model="m").message == (
        "Request for unknown model: 'm' is not found"
    )
    assert errors.ModelLoadError(model="m", reason="r").message == "load failed for model 'm': r"
    assert errors.ModelPollError(model="m", reason="r").message == (
        "failed to load 'm', failed to poll from model repository: r"
    )


def test_unsupported_compression_advertises_what_is_accepted():
    response = from_error(errors.UnsupportedCompressionError(encoding="br"))
    assert response.headers["accept-encoding"] == "gzip, deflate"
    assert json.loads(bytes(response.body)) == {"error": "Unsupported compression type"}


def test_the_header_follows_the_type_not_the_text():
    response = from_error(errors.UnsupportedError("Unsupported compression type"))
    assert "accept-encoding" not in response.headers
