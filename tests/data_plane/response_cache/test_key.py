"""Cache keys: equal for requests the model answers the same, different wherever the answer
may differ (a name, a datatype, a shape, a byte, and for models that see them the requested
outputs and parameters)."""

from __future__ import annotations

import numpy as np
import pytest

from data_plane.response_cache import request_key
from runtimes.model_request import RequestContext

MODEL = b"model\x001\x00load"


def _fp32(*values: float, shape: tuple[int, ...] = (1, 4)) -> np.ndarray:
    return np.array(values, dtype=np.float32).reshape(shape)


BASE = {"INPUT0": _fp32(1, 2, 3, 4), "INPUT1": _fp32(5, 6, 7, 8)}


def test_equal_requests_have_equal_keys() -> None:
    copy = {name: array.copy() for name, array in BASE.items()}
    assert request_key(MODEL, BASE) == request_key(MODEL, copy)
    assert len(request_key(MODEL, BASE)) == 32


def test_the_order_inputs_come_in_does_not_matter() -> None:
    reordered = {"INPUT1": BASE["INPUT1"], "INPUT0": BASE["INPUT0"]}
    assert request_key(MODEL, BASE) == request_key(MODEL, reordered)


def test_a_non_contiguous_view_keys_as_its_values() -> None:
    wide = np.arange(8, dtype=np.float32).reshape(2, 4)
    view = wide[:, ::2]
    assert not view.flags.c_contiguous
    assert request_key(MODEL, {"X": view}) == request_key(MODEL, {"X": view.copy()})


@pytest.mark.parametrize(
    "other",
    [
        pytest.param({**BASE, "INPUT1": _fp32(5, 6, 7, 9)}, id="one-byte"),
        pytest.param({**BASE, "INPUT1": _fp32(5, 6, 7, 8, shape=(2, 2))}, id="shape"),
        pytest.param({**BASE, "INPUT1": _fp32(5, 6, 7, 8, shape=(4,))}, id="rank"),
        pytest.param(
            {**BASE, "INPUT1": _fp32(5, 6, 7, 8).view(np.int32)}, id="datatype-same-bytes"
        ),
        pytest.param({"INPUT0": BASE["INPUT0"], "INPUT2": BASE["INPUT1"]}, id="name"),
        pytest.param({"INPUT0": BASE["INPUT0"]}, id="an-input-fewer"),
        pytest.param(
            {"INPUT0": BASE["INPUT1"], "INPUT1": BASE["INPUT0"]}, id="values-swapped-between"
        ),
    ],
)
def test_requests_that_may_be_answered_differently_have_different_keys(
    other: dict[str, np.ndarray],
) -> None:
    assert request_key(MODEL, BASE) != request_key(MODEL, other)


def test_the_model_version_and_load_are_in_the_key() -> None:
    assert request_key(MODEL, BASE) != request_key(b"model\x002\x00load", BASE)


def test_bytes_elements_are_keyed_by_their_boundaries_and_kind() -> None:
    def words(*elements: object) -> dict[str, np.ndarray]:
        array = np.empty(len(elements), dtype=object)
        array[:] = elements
        return {"TEXT": array}

    assert request_key(MODEL, words(b"ab", b"c")) == request_key(MODEL, words(b"ab", b"c"))
    assert request_key(MODEL, words(b"ab", b"c")) != request_key(MODEL, words(b"a", b"bc"))
    assert request_key(MODEL, words(b"ab")) != request_key(MODEL, words("ab"))


def test_requested_outputs_and_parameters_count_for_models_that_see_them() -> None:
    def context(outputs: tuple[str, ...], **parameters: bool | int | float | str) -> RequestContext:
        return RequestContext(requested_outputs=outputs, parameters=parameters)

    plain = request_key(MODEL, BASE, context(("OUTPUT0",)))
    assert plain == request_key(MODEL, BASE, context(("OUTPUT0",)))
    assert plain != request_key(MODEL, BASE, context(("OUTPUT1",)))
    assert plain != request_key(MODEL, BASE, context(("OUTPUT0", "OUTPUT1")))
    assert plain != request_key(MODEL, BASE, context(("OUTPUT0",), scale=2))
    assert request_key(MODEL, BASE, context((), scale=2)) != request_key(
        MODEL, BASE, context((), scale="2")
    )
    # The request id and correlation id are not the model's inputs.
    assert plain == request_key(
        MODEL, BASE, RequestContext(request_id="r-7", requested_outputs=("OUTPUT0",))
    )
