"""The C10 table: each control-plane error class maps to its status, body and headers."""

from __future__ import annotations

import orjson
import pytest

from control_plane.api.http_errors import from_error, status_for
from control_plane.errors import (
    ActivationTimeoutError,
    ConflictError,
    ControlPlaneUnavailableError,
    InvalidInputError,
    LoadFailedError,
    ModelExistsError,
    ModelNotFoundError,
    NoCapacityError,
    NotActingError,
    SchemaValidationError,
    UnauthorizedError,
    WorkerCallError,
    WorkerStartError,
)
from control_plane.store.errors import StoreConflictError, StoreUnavailableError
from foundation.errors import ZeroserveError


@pytest.mark.parametrize(
    ("error", "status", "retry_after"),
    [
        pytest.param(InvalidInputError("bad json"), 400, None, id="invalid-input"),
        pytest.param(SchemaValidationError(errors=[("name", "empty")]), 422, None, id="schema"),
        pytest.param(UnauthorizedError(reason="wrong admin token"), 401, None, id="unauthorized"),
        pytest.param(ModelNotFoundError(model="m"), 404, None, id="not-found"),
        pytest.param(ConflictError("clash"), 409, None, id="conflict"),
        pytest.param(ModelExistsError(model="m"), 409, None, id="exists"),
        pytest.param(ControlPlaneUnavailableError("later"), 503, "1", id="unavailable"),
        pytest.param(NoCapacityError(model="m", reason="full"), 503, "5", id="no-capacity"),
        pytest.param(
            ActivationTimeoutError(model="m", timeout_s=3), 503, "5", id="activation-timeout"
        ),
        pytest.param(WorkerStartError(pool="p", reason="exit 1"), 503, "5", id="worker-start"),
        pytest.param(NotActingError(), 503, "2", id="not-acting"),
        pytest.param(WorkerCallError(worker="w", reason="reset"), 502, None, id="upstream"),
        pytest.param(
            LoadFailedError(model="m", worker="w", reason="400: x"), 502, None, id="load-failed"
        ),
        pytest.param(StoreConflictError("model 'm' already exists"), 409, None, id="store-clash"),
        pytest.param(
            StoreUnavailableError(store="memory", operation="get_model", reason="closed"),
            503,
            "1",
            id="store-unavailable",
        ),
        pytest.param(ZeroserveError("unmapped"), 500, None, id="base"),
    ],
)
def test_status_body_and_retry_after(error: ZeroserveError, status: int, retry_after: str | None):
    assert status_for(error) == status
    response = from_error(error)
    assert response.status_code == status
    body = orjson.loads(bytes(response.body))
    assert body["error"] == error.message
    assert response.headers.get("retry-after") == retry_after
    assert response.headers["content-type"] == "application/json"


def test_schema_error_lists_the_fields():
    error = SchemaValidationError(errors=[("name", "empty"), ("scaling.min_replicas", "< 0")])
    body = orjson.loads(bytes(from_error(error).body))
    assert body == {
        "error": "name: empty; scaling.min_replicas: < 0",
        "fields": ["name", "scaling.min_replicas"],
    }


def test_messages_are_built_from_the_fields():
    assert LoadFailedError(model="m", worker="w1", reason="boom").message == (
        "worker w1: loading model 'm' failed: boom"
    )
    assert NoCapacityError(model="m", reason="full").message == "no worker can take model 'm': full"


def test_the_state_store_errors_are_in_the_one_tree():
    """``except ZeroserveError`` (or ``ControlPlaneError``) catches a store failure too."""
    unavailable = StoreUnavailableError(store="memory", operation="get_model", reason="closed")
    assert isinstance(unavailable, ControlPlaneUnavailableError)
    assert unavailable.message == "state store memory unavailable during get_model: closed"
    assert isinstance(StoreConflictError("clash"), ConflictError)
