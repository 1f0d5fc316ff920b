"""Every activator error maps to one status and the OIP ``{"error": ...}`` body."""

from __future__ import annotations

import orjson
import pytest

from activator import http_errors
from activator.errors import (
    ActivationFailedError,
    ActivatorUnavailableError,
    BufferFullError,
    CatalogUnavailableError,
    ClientClosedError,
    ColdStartTimeoutError,
    ModelNotRegisteredError,
    RequestTooLargeError,
    ShuttingDownError,
    TooManyRequestsError,
    UnroutableRequestError,
    UpstreamBusyError,
    UpstreamError,
    UpstreamTimeoutError,
)
from foundation.errors import ModelFailedError, ZeroserveError


@pytest.mark.parametrize(
    ("error", "status", "retry_after", "message"),
    [
        pytest.param(UnroutableRequestError("bad"), 400, None, "bad", id="invalid-input"),
        pytest.param(
            RequestTooLargeError(size=11, limit=10),
            413,
            None,
            "request body of 11 bytes exceeds the limit of 10 bytes",
            id="too-large",
        ),
        pytest.param(
            ModelNotRegisteredError(model="m"),
            404,
            None,
            "model 'm' is not registered",
            id="not-found",
        ),
        pytest.param(
            ClientClosedError(path="/v2/models/m/infer"),
            499,
            None,
            "the client closed the connection before sending all of /v2/models/m/infer",
            id="client-closed",
        ),
        pytest.param(
            TooManyRequestsError("slow down", retry_after_s=2), 429, "2", "slow down", id="429"
        ),
        pytest.param(
            BufferFullError(model="m", limit=5, retry_after_s=1),
            429,
            "1",
            "model 'm' is starting and its request buffer is full (5 requests waiting)",
            id="buffer-full",
        ),
        pytest.param(
            ActivatorUnavailableError("later", retry_after_s=4), 503, "4", "later", id="503"
        ),
        pytest.param(
            ActivationFailedError(model="m", reason="no room", retry_after_s=1),
            503,
            "1",
            "model 'm' could not be activated: no room",
            id="activation-failed",
        ),
        pytest.param(
            ColdStartTimeoutError(model="m", timeout_s=120, retry_after_s=1),
            503,
            "1",
            "model 'm' did not become ready within 120 s",
            id="activation-timeout",
        ),
        pytest.param(
            UpstreamBusyError(model="m", retry_after_s=1),
            503,
            "1",
            "model 'm': every connection to its workers is busy",
            id="upstream-busy",
        ),
        pytest.param(
            CatalogUnavailableError(model="m", reason="ConnectionError", retry_after_s=1),
            503,
            "1",
            "cannot look up model 'm': state store unavailable (ConnectionError)",
            id="store-unavailable",
        ),
        pytest.param(
            ShuttingDownError(model="m", retry_after_s=0),
            503,
            "0",
            "model 'm': the activator is shutting down",
            id="shutting-down",
        ),
        pytest.param(
            UpstreamError(model="m", url="http://w", reason="reset"),
            502,
            None,
            "model 'm': worker http://w failed: reset",
            id="upstream",
        ),
        pytest.param(
            UpstreamTimeoutError(model="m", url="http://w", timeout_s=1.5),
            504,
            None,
            "model 'm': worker http://w did not answer within 1.5 s",
            id="upstream-timeout",
        ),
        pytest.param(
            ModelFailedError(model="m", reason="bad config", failed_at=1.0),
            424,
            None,
            "model 'm' failed to load and is not retried until its registration changes or "
            "it is loaded again (zeroserve models load m): bad config",
            id="model-failed",
        ),
        pytest.param(ZeroserveError("odd"), 500, None, "odd", id="unmapped"),
    ],
)
def test_error_mapping(
    error: ZeroserveError, status: int, retry_after: str | None, message: str
) -> None:
    response = http_errors.from_error(error)
    assert response.status_code == status
    assert response.headers.get("retry-after") == retry_after
    assert response.headers["content-type"] == "application/json"
    assert orjson.loads(bytes(response.body)) == {"error": message}


def test_a_failed_model_is_answered_in_openai_shape_with_a_status_clients_do_not_retry():
    error = ModelFailedError(model="m", reason="bad config", failed_at=1.0)
    response = http_errors.openai_from_error(error)
    # The openai SDK retries 408, 409, 429 and 5xx on its own; 424 it does not.
    assert response.status_code == 424
    assert "retry-after" not in response.headers
    body = orjson.loads(bytes(response.body))
    assert body["error"]["code"] == "model_failed"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].endswith("bad config")


def test_a_failed_model_is_failed_precondition_on_grpc():
    import grpc

    from activator.grpc.status import grpc_status

    status = grpc_status(ModelFailedError(model="m", reason="bad", failed_at=1.0), "ModelInfer")
    assert status.code == grpc.StatusCode.FAILED_PRECONDITION
    assert status.message.endswith(": bad")
    assert status.metadata == ()
