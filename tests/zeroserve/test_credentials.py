"""``zeroserve.credentials``: the admin URL and token kept per user, readable by them alone."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from zeroserve.credentials import (
    CredentialsError,
    config_path,
    read_credentials,
    store_credentials,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_file_is_under_xdg_config_home_else_dot_config(tmp_path: Path):
    assert config_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "zeroserve/config.json"
    home = {"HOME": str(tmp_path)}
    assert config_path(home) == tmp_path / ".config/zeroserve/config.json"
    # The XDG spec: a relative value is ignored.
    assert config_path({**home, "XDG_CONFIG_HOME": "rel"}) == config_path(home)


def test_stored_file_is_0600_in_a_0700_folder_whatever_the_umask(tmp_path: Path):
    path = tmp_path / "cfg" / "zeroserve" / "config.json"
    old = os.umask(0)  # the most permissive umask: the modes must not come from it
    try:
        store_credentials(path, "http://127.0.0.1:8081/", "secret-token-1")
    finally:
        os.umask(old)
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700
    assert read_credentials(path).token_for("http://127.0.0.1:8081") == "secret-token-1"
    # Nothing is left beside it (the temporary file was renamed into place).
    assert [p.name for p in path.parent.iterdir()] == ["config.json"]


def test_a_rewrite_keeps_other_urls_and_says_what_it_changed(tmp_path: Path):
    path = tmp_path / "config.json"
    first = store_credentials(path, "https://cluster.example", "cluster-token")
    assert (first.replaced_token, first.previous_current) == (False, None)
    local = store_credentials(path, "http://127.0.0.1:8081", "local-token-1")
    assert local.previous_current == "https://cluster.example"
    again = store_credentials(path, "http://127.0.0.1:8081", "local-token-2")
    assert again.replaced_token and again.previous_current is None
    stored = read_credentials(path)
    assert stored.current == "http://127.0.0.1:8081"
    assert stored.token_for("https://cluster.example/") == "cluster-token"
    assert stored.token_for("http://127.0.0.1:8081") == "local-token-2"
    assert stored.token_for("http://elsewhere") is None
    assert mode(path) == 0o600


def test_a_missing_file_is_empty_and_a_broken_one_is_an_error_naming_it(tmp_path: Path):
    path = tmp_path / "config.json"
    assert read_credentials(path).current is None
    path.write_text("{not json")
    with pytest.raises(CredentialsError, match=str(path)):
        read_credentials(path)
    with pytest.raises(CredentialsError):
        store_credentials(path, "http://x", "token-xyz")
    assert path.read_text() == "{not json"  # left for its owner to look at


def test_the_file_is_json_anyone_can_read_back(tmp_path: Path):
    path = tmp_path / "config.json"
    store_credentials(path, "http://a:1", "token-a-1")
    assert json.loads(path.read_text()) == {
        "admins": {"http://a:1": {"token": "token-a-1"}},
        "current": "http://a:1",
    }
