"""Storage URIs: spellings, allowed roots, and names or keys that would escape the cache."""

from __future__ import annotations

import os

import pytest

from data_plane.storage import StorageNotAllowedError, StorageUri, parse_storage_uri
from data_plane.storage.uris import check_relative_path, relative_key


@pytest.mark.parametrize(
    ("uri", "allowed", "expected"),
    [
        pytest.param("s3://models/resnet", ["s3://models"], ("s3", "models", "resnet"), id="s3"),
        pytest.param("s3://models/a/b/", ["s3://models/a"], ("s3", "models", "a/b"), id="slash"),
        pytest.param("s3://models", ["s3://models"], ("s3", "models", ""), id="bucket"),
        pytest.param("file:///srv/m", ["/srv"], ("file", "", "/srv/m"), id="file"),
        pytest.param("file://localhost/srv/m", ["/srv"], ("file", "", "/srv/m"), id="localhost"),
        pytest.param("/srv/m/../m2", ["file:///srv"], ("file", "", "/srv/m2"), id="normalized"),
        pytest.param("/srv", ["/srv"], ("file", "", "/srv"), id="root-itself"),
        pytest.param("/anything", ["/"], ("file", "", "/anything"), id="filesystem-root"),
    ],
)
def test_parses_allowed_uris(uri: str, allowed: list[str], expected: tuple[str, ...]) -> None:
    parsed = parse_storage_uri(uri, allowed=allowed)
    assert (parsed.scheme, parsed.bucket, parsed.key) == expected


def test_relative_plain_path_is_made_absolute() -> None:
    parsed = parse_storage_uri("models", allowed=[os.getcwd()])
    assert parsed.key == os.path.join(os.getcwd(), "models")


@pytest.mark.parametrize(
    ("uri", "allowed", "reason"),
    [
        pytest.param("s3://models-private/x", ["s3://models"], "not under", id="bucket-prefix"),
        pytest.param("s3://models/ab", ["s3://models/a"], "not under", id="key-prefix"),
        pytest.param("/srv2/m", ["/srv"], "not under", id="path-prefix"),
        pytest.param("/srv/../etc", ["/srv"], "not under", id="dotdot-out"),
        pytest.param("s3://models/a", [], "no storage is allowed", id="nothing-allowed"),
        pytest.param("s3://models/a/../b", ["s3://models"], "escape", id="s3-dotdot"),
        pytest.param("s3://models//a", ["s3://models"], "escape", id="s3-empty-part"),
        pytest.param("s3://Bad_Bucket/a", ["s3://Bad_Bucket"], "invalid bucket", id="bucket"),
        pytest.param("gs://models/a", ["gs://models"], "unsupported scheme", id="scheme"),
        pytest.param("file://host/a", ["/"], "on this host", id="remote-file"),
        pytest.param("file:///a?x=1", ["/"], "must not have", id="query"),
        pytest.param("s3://models/a\x00b", ["s3://models"], "control", id="nul"),
        pytest.param("", ["/"], "empty", id="empty"),
    ],
)
def test_refuses(uri: str, allowed: list[str], reason: str) -> None:
    with pytest.raises(StorageNotAllowedError, match=reason):
        parse_storage_uri(uri, allowed=allowed)


def test_str_round_trips() -> None:
    for text in ("s3://models/a/b", "s3://models", "file:///srv/m"):
        assert str(parse_storage_uri(text, allowed=[text])) == text


def test_child_checks_the_model_name() -> None:
    repo = parse_storage_uri("s3://models/repo", allowed=["s3://models"])
    assert repo.child("resnet-50.v2") == StorageUri(
        "s3", "models", "repo/resnet-50.v2", "s3://models"
    )
    for bad in ("..", ".", "a/b", "", "a\\b", "-x" * 200):
        with pytest.raises(StorageNotAllowedError, match="model name"):
            repo.child(bad)


@pytest.mark.parametrize(
    "relative", ["../x", "1/../../x", "1//x", "./x", "1/.", "", "1/x\n", "a\\..\\b"]
)
def test_unsafe_relative_keys_are_refused(relative: str) -> None:
    with pytest.raises(StorageNotAllowedError, match="would escape the cache folder"):
        check_relative_path(relative, uri="s3://b/p")


def test_relative_key() -> None:
    assert relative_key("repo/m/1/model.onnx", "repo/m", uri="u") == "1/model.onnx"
    assert relative_key("1/model.onnx", "", uri="u") == "1/model.onnx"
    with pytest.raises(StorageNotAllowedError, match="outside the prefix"):
        relative_key("repo/m2/1/model.onnx", "repo/m", uri="u")
