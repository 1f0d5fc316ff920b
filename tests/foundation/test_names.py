"""The one model-name rule: what it accepts and refuses, and that the node cache applies it."""

from __future__ import annotations

import pytest

from data_plane.storage.errors import StorageNotAllowedError
from data_plane.storage.uris import check_model_name
from foundation.names import MODEL_NAME_MAX_LENGTH, model_name_problem

BAD_NAMES = [
    pytest.param("", id="empty"),
    pytest.param(".", id="dot"),
    pytest.param("..", id="dot-dot"),
    pytest.param(".hidden", id="leading-dot"),
    pytest.param("-opt", id="leading-dash"),
    pytest.param("a/b", id="slash"),
    pytest.param("a\\b", id="backslash"),
    pytest.param("a%2Fb", id="escaped-slash"),
    pytest.param("a?b", id="question-mark"),
    pytest.param("a#b", id="hash"),
    pytest.param("a b", id="space"),
    pytest.param("a\x01b", id="control-character"),
    pytest.param("a\n", id="trailing-newline"),
    pytest.param("modèle", id="non-ascii"),
    pytest.param("x" * (MODEL_NAME_MAX_LENGTH + 1), id="too-long"),
    pytest.param("x" * 255, id="255-characters"),
]
GOOD_NAMES = ["m", "resnet50.v2", "a_b-c.1", "_private", "9lives", "x" * MODEL_NAME_MAX_LENGTH]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_refused_with_the_rule(name: str):
    problem = model_name_problem(name)
    assert problem is not None
    assert "letters, digits" in problem
    with pytest.raises(StorageNotAllowedError, match="is not allowed"):
        check_model_name(name, uri="/models/x")


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_names_pass(name: str):
    assert model_name_problem(name) is None
    check_model_name(name, uri="/models/x")
