"""The command line against a real ``zeroserve up``: every ``models`` command in every output
format (``activations --watch`` and ``login`` included), with the admin URL and token that
``up`` stored (and never printed)."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from control_plane.api.watch import watch
from tests.integration.test_platform_e2e import (
    AUTH,
    SIZES,
    SLOW_MODEL,
    TOKEN,
    Platform,
    start_platform,
)
from tests.models import write_onnx_mlp, write_python_model
from zeroserve.cli import admin_settings, build_parser, main
from zeroserve.credentials import read_credentials, store_credentials

pytestmark = pytest.mark.integration

CLUSTER = "https://zeroserve.example.com"
CLUSTER_TOKEN = "cluster-token-0123456789"
PARSERS: dict[str, Callable[[str], Any]] = {"json": json.loads, "yaml": yaml.safe_load}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Platform, Path]]:
    """A platform started by a user who had logged in to a cluster before."""
    tmp_path = tmp_path_factory.mktemp("cli")
    config_home = tmp_path / "config"
    store_credentials(config_home / "zeroserve" / "config.json", CLUSTER, CLUSTER_TOKEN)
    platform = start_platform(tmp_path, "cli", XDG_CONFIG_HOME=str(config_home))
    try:
        # Stored once every server listens, which may be just after the probes answer.
        deadline = time.monotonic() + 30
        while "stored in" not in platform.log() and time.monotonic() < deadline:
            assert platform.process.poll() is None, platform.log()
            time.sleep(0.1)
        yield platform, config_home
    finally:
        platform.stop()
        leftovers = platform.wait_workers_gone()
        platform.kill_leftovers()
        assert not leftovers, f"orphan workers {leftovers}"


@pytest.fixture
def user(up: tuple[Platform, Path], monkeypatch: pytest.MonkeyPatch) -> Platform:
    """The environment of that user: nothing but the stored credentials says where to go."""
    platform, config_home = up
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config_home))
    monkeypatch.delenv("ZEROSERVE_ADMIN_URL", raising=False)
    monkeypatch.delenv("ZEROSERVE_ADMIN_TOKEN", raising=False)
    return platform


def zeroserve(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``zeroserve ARGV`` in this process: (status, stdout, stderr); no token in either."""
    code = main(list(argv))
    captured = capsys.readouterr()
    for secret in (TOKEN, CLUSTER_TOKEN):
        assert secret not in captured.out and secret not in captured.err
    return code, captured.out, captured.err


def api(platform: Platform, path: str) -> Any:
    response = httpx.get(f"{platform.admin}/admin/v1{path}", headers=AUTH, timeout=30)
    response.raise_for_status()
    return response.json()


def fields(doc: dict[str, Any]) -> set[str]:
    return set(doc)


def table_value(out: str, field: str) -> str:
    """The value on ``FIELD  value`` line of a one-object table."""
    match = re.search(rf"^{field}\s+(.*)$", out, re.MULTILINE)
    assert match, out
    return match.group(1)


def test_up_stores_its_url_and_token_and_prints_neither_token(up: tuple[Platform, Path]):
    platform, config_home = up
    path = config_home / "zeroserve" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = read_credentials(path)
    assert stored.current == platform.admin
    assert stored.token_for(platform.admin) == TOKEN
    # The cluster's entry is kept, and the output says the default moved away from it.
    assert stored.token_for(CLUSTER) == CLUSTER_TOKEN
    log = platform.log()
    assert f"stored in {path}" in log and f"the default admin API was {CLUSTER}" in log
    assert TOKEN not in log and CLUSTER_TOKEN not in log


def test_every_models_command_in_every_format(user: Platform, capsys):
    model_dir = write_onnx_mlp(user.models_dir, "cli-m", SIZES, seed=21)
    code, out, err = zeroserve(
        capsys, "models", "register", "cli-m", "--storage-uri", str(model_dir)
    )
    assert (code, err) == (0, ""), err
    assert table_value(out, "STATE") == "scaled_to_zero"
    assert re.fullmatch(r"just now|\d+s ago", table_value(out, "CREATED"))

    code, out, err = zeroserve(capsys, "models", "ls")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["NAME", "STATE", "REPLICAS"]
    assert any(row.split()[:3] == ["cli-m", "scaled_to_zero", "0"] for row in rows), out

    code, out, err = zeroserve(capsys, "models", "load", "cli-m")
    assert code == 0, err
    assert table_value(out, "STATE") == "ready"
    assert re.match(r"ready in [\d.]+ (ms|s), cache local", table_value(out, "LAST_ACTIVATION"))
    assert table_value(out, "VERSIONS") == "1"  # as the replica's worker says

    # show adds the model's last 24 hours of usage (the admin API's /usage), once the
    # control plane has written it (every few seconds): the load just done is loading time
    # and, asked for by the admin and not a request, no cold start.
    deadline = time.monotonic() + 60
    while True:
        code, out, err = zeroserve(capsys, "models", "show", "cli-m")
        assert code == 0, err
        assert table_value(out, "STATE") == "ready"
        if table_value(out, "LOADING_24H") != "0 ms" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for field in ("SERVING_24H", "IDLE_24H", "LOADING_24H", "COLD_START_WAIT_24H"):
        assert re.fullmatch(r"[\d.]+ (ms|s)|\d+[mhd] \d\d[smh]", table_value(out, field)), out
    assert table_value(out, "LOADING_24H") != "0 ms", out
    assert table_value(out, "COLD_STARTS_24H") == "0", out

    code, out, err = zeroserve(capsys, "models", "activations", "cli-m")
    assert code == 0, err
    header, first, *_ = out.splitlines()
    assert header.split()[:3] == ["QUEUED", "TRIGGER", "OUTCOME"]
    assert "ready" in first.split() and re.search(r"\d (ms|s)\b", first), out

    code, out, err = zeroserve(capsys, "models", "workers")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["ID", "POOL", "DEVICE", "STATE"]
    assert any(
        "cli-m" in row.split() and re.search(r"just now|\d+[smhd] ago", row) for row in rows
    ), out

    # json and yaml: the admin API's own documents, every field.
    for fmt, parse in PARSERS.items():
        for argv, path in (
            (["ls"], "/models"),
            (["show", "cli-m"], "/models/cli-m"),
            (["activations", "cli-m"], "/models/cli-m/activations"),
            (["workers"], "/workers"),
        ):
            code, out, err = zeroserve(capsys, "models", *argv, "-o", fmt)
            assert code == 0, err
            printed, served = parse(out), api(user, path)
            assert fields(printed) == fields(served), (argv, fmt)
            for key in ("models", "activations", "workers"):
                if key in served:
                    assert [fields(x) for x in printed[key]] == [fields(x) for x in served[key]]
        assert parse(out)["workers"][0]["models"] == ["cli-m"]

    # The commands that change a model print the model as it is after the change, in
    # every format; json and yaml parsed back.
    for replicas, fmt in enumerate(("table", "json", "yaml"), start=2):
        code, out, err = zeroserve(
            capsys, "models", "update", "cli-m", "--max-replicas", str(replicas), "-o", fmt
        )
        assert code == 0, err
        printed = table_value(out, "MAX_REPLICAS") if fmt == "table" else None
        if fmt != "table":
            printed = str(PARSERS[fmt](out)["scaling"]["max_replicas"])
        assert (
            printed == str(replicas) == str(api(user, "/models/cli-m")["scaling"]["max_replicas"])
        )
    for action, fmt in (("unload", "yaml"), ("load", "json"), ("unload", "table")):
        code, out, err = zeroserve(capsys, "models", action, "cli-m", "-o", fmt)
        assert code == 0, err
        state = table_value(out, "STATE") if fmt == "table" else None
        if fmt != "table":
            state = PARSERS[fmt](out)["status"]["state"]
        assert state == ("ready" if action == "load" else "scaled_to_zero")
    for fmt in ("json", "yaml"):
        name = f"cli-{fmt}"
        model_dir = write_onnx_mlp(user.models_dir, name, SIZES, seed=23)
        code, out, err = zeroserve(
            capsys, "models", "register", name, "--storage-uri", str(model_dir), "-o", fmt
        )
        assert code == 0, err
        assert PARSERS[fmt](out) == api(user, f"/models/{name}")
        code, out, err = zeroserve(capsys, "models", "rm", name, "-o", fmt)
        assert (code, PARSERS[fmt](out)) == (0, {"name": name, "deleted": True}), err

    code, out, err = zeroserve(capsys, "models", "rm", "cli-m")
    assert code == 0 and out.split() == ["NAME", "cli-m", "DELETED", "yes"], err
    code, out, err = zeroserve(capsys, "models", "ls", "-o", "yaml")
    assert "cli-m" not in [m["name"] for m in yaml.safe_load(out)["models"]]


def test_errors_go_to_stderr_and_name_the_fix(user: Platform, capsys, monkeypatch, tmp_path):
    code, out, err = zeroserve(capsys, "models", "show", "never-registered")
    assert (code, out) == (1, "") and "(404)" in err and "`zeroserve models ls`" in err

    model_dir = write_onnx_mlp(user.models_dir, "twice", SIZES, seed=22)
    register = ["models", "register", "twice", "--storage-uri", str(model_dir)]
    assert zeroserve(capsys, *register)[0] == 0
    code, out, err = zeroserve(capsys, *register)
    assert (code, out) == (1, "") and "(409)" in err and "zeroserve models update twice" in err

    code, out, err = zeroserve(capsys, "models", "update", "twice", "--max-replicas", "0")
    assert (code, out) == (1, "") and "(422)" in err and "--max-replicas" in err

    code, out, err = zeroserve(capsys, "models", "ls", "--token", "not-the-token")
    assert (code, out) == (1, "") and "(401)" in err
    assert "run `zeroserve login` or pass --token" in err

    code, out, err = zeroserve(capsys, "models", "ls", "--url", "http://127.0.0.1:9")
    assert (code, out) == (2, "") and "no admin token for http://127.0.0.1:9" in err
    code, out, err = zeroserve(
        capsys, "models", "ls", "--url", "http://127.0.0.1:9", "--token", "x" * 12
    )
    assert (code, out) == (1, "") and "cannot reach" in err and "--url" in err

    code, out, err = zeroserve(capsys, "models", "activations", "never-registered", "--watch")
    assert (code, out) == (1, "") and "(404)" in err and "`zeroserve models ls`" in err

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "nobody"))
    code, out, err = zeroserve(capsys, "models", "ls")
    assert code == 2 and out == "" and "run `zeroserve login` or pass --token" in err
    assert "Authorization" not in err  # not the HTTP header recipe of the API's 401
    code, out, err = zeroserve(capsys, "models", "activations", "twice", "--watch")
    assert code == 2 and out == "" and "run `zeroserve login` or pass --token" in err


def test_login_checks_the_token_and_stores_it(user: Platform, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = tmp_path / "config" / "zeroserve" / "config.json"
    code, out, err = zeroserve(capsys, "login", "--url", user.admin, "--token", "wrong-token-1")
    assert (code, out) == (1, "") and "(401)" in err and not path.exists()

    monkeypatch.setattr(sys, "stdin", io.StringIO(TOKEN + "\n"))  # as `... | zeroserve login`
    code, out, err = zeroserve(capsys, "login", "--url", user.admin)
    assert code == 0, err
    assert f"stored in {path}" in out
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    code, out, err = zeroserve(capsys, "models", "ls", "-o", "json")
    assert code == 0 and "models" in json.loads(out), err

    # What it stored, as a document for a script (the token never in it).
    for fmt, parse in PARSERS.items():
        monkeypatch.setattr(sys, "stdin", io.StringIO(TOKEN + "\n"))
        code, out, err = zeroserve(capsys, "login", "--url", user.admin, "-o", fmt)
        assert code == 0, err
        assert parse(out) == {
            "url": user.admin,
            "path": str(path),
            "replaced_token": False,
            "previous_default": None,
        }


def test_watch_prints_each_change_in_json_and_yaml(user: Platform, capsys):
    """One load followed by two watchers: ``-o json`` through the command (one document a
    line) and ``-o yaml`` (one document each), both from the running phase to ready."""
    model_dir = write_python_model(user.models_dir, "cli-watched", SLOW_MODEL, dims=(4,))
    register = ["models", "register", "cli-watched", "--storage-uri", str(model_dir)]
    assert zeroserve(capsys, *register)[0] == 0
    capsys.readouterr()
    watch_argv = ["models", "activations", "cli-watched", "--watch", "--wait-s", "60"]
    settings = admin_settings(build_parser().parse_args(watch_argv), "test")
    assert settings is not None
    as_yaml, yaml_err = io.StringIO(), io.StringIO()
    codes: dict[str, int] = {}
    watchers = [
        threading.Thread(target=lambda: codes.update(json=main([*watch_argv, "-o", "json"]))),
        threading.Thread(
            target=lambda: codes.update(
                yaml=watch(
                    settings,
                    "cli-watched",
                    wait_s=60,
                    out=as_yaml,
                    err=yaml_err,
                    output="yaml",
                )
            )
        ),
    ]
    for watcher in watchers:
        watcher.start()
    try:
        # The load takes seconds (the model sleeps in initialize()): both watchers, started
        # first, see it run.
        loaded = httpx.post(
            f"{user.admin}/admin/v1/models/cli-watched/load", headers=AUTH, timeout=120
        )
        assert loaded.status_code == 200, loaded.text
    finally:
        for watcher in watchers:
            watcher.join(timeout=120)
    captured = capsys.readouterr()
    assert codes == {"json": 0, "yaml": 0}, captured.err + yaml_err.getvalue()
    assert TOKEN not in captured.out + captured.err + as_yaml.getvalue()
    for timelines in (
        [json.loads(line) for line in captured.out.splitlines()],
        list(yaml.safe_load_all(as_yaml.getvalue())),
    ):
        assert timelines[0]["outcome"] == "running", timelines
        assert timelines[-1]["outcome"] == "ready" and "durations_s" in timelines[-1]
        assert {t["id"] for t in timelines} == {timelines[-1]["id"]}
    assert httpx.delete(
        f"{user.admin}/admin/v1/models/cli-watched", headers=AUTH, timeout=60
    ).is_success


def test_the_installed_command_reads_the_stored_credentials(user: Platform):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROSERVE_ADMIN_")}
    done = subprocess.run(
        [sys.executable, "-m", "zeroserve.cli", "models", "ls", "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "models" in json.loads(done.stdout)
    assert TOKEN not in done.stdout + done.stderr


def test_every_keys_command_in_every_format(user: Platform, capsys):
    """create, ls, show and revoke in table, json and yaml (parsed back against the admin
    API's documents); the key's secret is printed by create alone."""
    secrets: list[str] = []
    for fmt in ("table", "json", "yaml"):
        code, out, err = zeroserve(
            capsys, "keys", "create", f"cli-{fmt}", "--model", "cli-*", "-o", fmt
        )
        assert code == 0, err
        if fmt == "table":
            key = out.strip().splitlines()[-1]
        else:
            created = PARSERS[fmt](out)
            assert created["name"] == f"cli-{fmt}" and created["models"] == ["cli-*"]
            assert created["state"] == "active"
            key = created["key"]
        assert key.startswith("zs_")
        secrets.append(key)
    listed = api(user, "/keys")
    for fmt, parse in PARSERS.items():
        code, out, err = zeroserve(capsys, "keys", "ls", "-o", fmt)
        assert code == 0 and parse(out) == listed, err
        key_id = secrets[0].split("_")[1]
        code, out, err = zeroserve(capsys, "keys", "show", key_id, "-o", fmt)
        assert code == 0 and parse(out) == api(user, f"/keys/{key_id}"), err
    code, out, err = zeroserve(capsys, "keys", "ls")
    assert code == 0 and out.split()[:3] == ["ID", "NAME", "STATE"], err
    code, out, err = zeroserve(capsys, "keys", "show", secrets[0].split("_")[1])
    assert code == 0 and table_value(out, "STATE") == "active", err
    for key, fmt in zip(secrets, ("table", "json", "yaml"), strict=True):
        key_id = key.split("_")[1]
        code, out, err = zeroserve(capsys, "keys", "revoke", key_id, "-o", fmt)
        assert code == 0, err
        if fmt == "table":
            assert out.startswith(f"revoked key {key_id}")
        else:
            assert PARSERS[fmt](out)["state"] == "revoked"
        assert api(user, f"/keys/{key_id}")["state"] == "revoked"
    code, out, err = zeroserve(capsys, "keys", "ls", "-o", "json")
    printed = out + json.dumps(api(user, "/keys"))
    assert all(key.split("_", 2)[2] not in printed for key in secrets)
