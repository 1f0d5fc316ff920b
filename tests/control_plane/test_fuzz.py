"""Generated requests against the admin API in process: no 5xx, no slow answer.

Schemathesis draws requests from the API's own OpenAPI document, sent with the admin token
(and without it, a share of the time) to the API over the in-memory store and the recording
backend and workers of the other in-process API tests: this checks what the API does with
hostile input, not worker processes (the integration tests start those). Half of the named
cases are aimed at a registered model so the lifecycle routes see more than 404s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from control_plane.api.openapi import openapi_document
from tests.control_plane.test_api import AUTH, running_api
from tests.fuzzing import FUZZ, FuzzClient, cases, operations, serving

REGISTERED = "fuzzed"
OPERATIONS = operations(openapi_document())


@pytest.fixture(scope="module")
def admin() -> Iterator[FuzzClient]:
    with serving(running_api()) as client:
        body = {"name": REGISTERED, "storage_uri": f"/models/{REGISTERED}"}
        registered = client.send(method="POST", url="/admin/v1/models", json=body, headers=AUTH)
        assert registered.status_code == 201, registered.text
        yield client


def _authorized(draw: st.DrawFn, case: Any) -> None:
    # DELETE stays on generated names: the registered model must outlive the module.
    if case.path_parameters and case.method.upper() != "DELETE" and draw(st.booleans()):
        case.path_parameters["name"] = REGISTERED
    if isinstance(case.body, dict) and "storage_uri" in case.body and draw(st.booleans()):
        # Under an allowed root, so registrations get past the URI check to the rest.
        case.body["storage_uri"] = "/models/" + draw(st.sampled_from(("a", "b/c", "d.e")))
    if isinstance(case.query, dict) and "follow" in case.query:
        # A follow streams for as long as it is asked to wait: kept to 0 here, where no
        # activation runs, so it ends at once and the no-slow-answer check still holds.
        case.query["wait_s"] = 0
    if draw(st.integers(min_value=0, max_value=9)):
        case.headers = {**(case.headers or {}), **AUTH}


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: f"{op.method} {op.path}")
def test_generated_requests_get_no_5xx(admin: FuzzClient, operation: Any) -> None:
    @settings(FUZZ, max_examples=200)
    @given(request=cases(operation, _authorized, "http://admin"))
    def check(request: dict[str, Any]) -> None:
        admin.send(**request)

    check()


def test_the_fuzzed_api_still_shows_the_model(admin: FuzzClient) -> None:
    """Runs last in the module: the API still answers, and still holds the model."""
    response = admin.send(method="GET", url=f"/admin/v1/models/{REGISTERED}", headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.json()["name"] == REGISTERED
