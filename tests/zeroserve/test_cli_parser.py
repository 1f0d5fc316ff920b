"""The command line's parser: help for everything, ``-o`` on every command that prints
results, the body ``zeroserve models update`` sends."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from zeroserve.cli import build_parser, update_body


def commands(
    parser: argparse.ArgumentParser, path: str = "zeroserve", text: str | None = "top"
) -> Iterator[tuple[str, argparse.ArgumentParser, str | None]]:
    """(command path, parser, its help line) for ``parser`` and every subcommand below it."""
    yield path, parser, text
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield from commands(sub, f"{path} {name}", helps.get(name))


def test_every_command_and_option_has_help_text():
    missing = []
    for path, parser, text in commands(build_parser()):
        if not text:
            missing.append(path)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if not action.help:
                missing.append(f"{path} {action.option_strings or action.dest}")
    assert missing == []


SERVERS = {"zeroserve serve", "zeroserve up", "zeroserve control-plane", "zeroserve activator"}
"""The commands that run a server: they log until stopped and print no result."""


def test_every_command_that_prints_results_takes_output():
    leaves = [
        (path, parser)
        for path, parser, _ in commands(build_parser())
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    ]
    assert {path for path, _ in leaves} >= SERVERS | {"zeroserve login", "zeroserve keys ls"}
    without = []
    for path, parser in leaves:
        formats = [a.choices for a in parser._actions if "-o" in a.option_strings]
        if path not in SERVERS and [list(f or ()) for f in formats] != [["table", "json", "yaml"]]:
            without.append(path)
    assert without == []


def test_top_level_help_is_for_users(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert "zeroserve up --demo" in text and "zeroserve models ls" in text
    assert "argument parsing only" not in text  # the module docstring is for developers


ADMIN_COMMANDS = [
    ["ls"],
    ["workers"],
    ["show", "m"],
    ["activations", "m"],
    ["load", "m"],
    ["unload", "m"],
    ["rm", "m"],
    ["register", "m", "--storage-uri", "/m"],
    ["update", "m", "--max-replicas", "2"],
]


@pytest.mark.parametrize("argv", ADMIN_COMMANDS, ids=lambda argv: argv[0])
def test_every_models_command_takes_output_before_or_after_it(argv: list[str]):
    parse = build_parser().parse_args
    assert parse(["models", *argv]).output == "table"
    assert parse(["models", "-o", "json", *argv]).output == "json"
    assert parse(["models", *argv, "-o", "yaml"]).output == "yaml"
    after = parse(["models", *argv, "--url", "http://a:1", "--token", "t0ken-123"])
    assert (after.url, after.token) == ("http://a:1", "t0ken-123")
    with pytest.raises(SystemExit):
        parse(["models", *argv, "-o", "xml"])


def test_update_sends_only_what_is_given():
    argv = ["update", "m", "--max-replicas", "3", "--idle-timeout-s", "60", "--device", "cuda"]
    args = build_parser().parse_args(["models", *argv])
    assert update_body(args) == {
        "scaling": {"max_replicas": 3, "idle_timeout_s": 60.0},
        "resources": {"device": "cuda"},
    }
    moved = build_parser().parse_args(["models", "update", "m", "--storage-uri", "s3://b/m2"])
    assert update_body(moved) == {"storage_uri": "s3://b/m2"}


def test_update_with_nothing_to_change_says_so():
    with pytest.raises(ValueError, match="nothing to change"):
        update_body(build_parser().parse_args(["models", "update", "m"]))
