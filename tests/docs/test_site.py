"""The documentation: the MkDocs site builds with ``--strict`` (a broken link, a missing
anchor or a page the nav names that is not there fails it), its generated references cover
the code they come from, the README stays a five-minute read whose commands are CI's, and
the numbers and files the pages cite exist."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import hcl2
import pytest

from control_plane.api.openapi import openapi_document
from zeroserve.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RESULTS = ROOT / "bench" / "results"
BUILD_TIMEOUT_S = 240


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_with_strict(tmp_path: Path) -> None:
    # Not -q: MkDocs counts warnings for --strict only where it logs them.
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml")]
        + ["-d", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    admin = (tmp_path / "site" / "api" / "admin-reference" / "index.html").read_text()
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "/admin/v1/models/{name}/activations" in admin
    assert "zeroserve models register" in cli


def test_the_admin_reference_has_every_path_and_schema() -> None:
    document = openapi_document()
    page = _hooks().render_openapi(document)
    for path, item in document["paths"].items():
        for method in item:
            assert f"### `{method.upper()} {path}`" in page
    for name, schema in document["components"]["schemas"].items():
        assert f"### {name}" in page
        for field in schema.get("properties", {}):
            assert f"| `{field}` |" in page, (name, field)


def _commands(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, Any]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, f"{path} {name}")
    return found


def test_the_cli_reference_has_every_command_and_option() -> None:
    page = _hooks().render_cli(build_parser())
    commands = _commands(build_parser(), "zeroserve")
    assert len(commands) > 5
    for path, parser in commands:
        assert f"`{path}`" in page, path
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in page, (path, flag)


def test_the_readme_is_short_and_runs_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) < 10_000
    ci_test_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_test_command in readme
    assert "zeroserve up --demo" in readme
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def _cited_results() -> dict[str, list[str]]:
    """Each bench/results file a page or README names, with whether it is marked as
    history (removed from the tree, kept in git)."""
    pages = [ROOT / "README.md", ROOT / "bench" / "README.md", *DOCS.rglob("*.md")]
    cited: dict[str, list[str]] = {}
    pattern = re.compile(
        r"(?:bench/)?results/(\d{4}-\d\d-\d\dT\d{6}Z-[\w.-]+?\.\w+)`([^`\n]{0,20})"
    )
    for page in pages:
        for name, after in pattern.findall(page.read_text(encoding="utf-8")):
            cited.setdefault(name, []).append(after)
    return cited


def test_every_cited_result_exists_or_is_marked_as_history() -> None:
    cited = _cited_results()
    assert cited
    for name, afters in cited.items():
        if not (RESULTS / name).exists():
            assert all("history" in after for after in afters), name


def _suite(name: str) -> str:
    """The suite of a result file: its name less the time stamp and the extension."""
    return name.split("-", 3)[-1].split("-", 1)[-1].rsplit(".", 1)[0]


def test_results_keep_the_newest_run_of_each_suite() -> None:
    stamps: dict[str, set[str]] = {}
    for path in RESULTS.iterdir():
        if path.is_file():
            stamps.setdefault(_suite(path.name), set()).add(path.name[:17])
    assert stamps
    for suite, runs in stamps.items():
        assert len(runs) == 1, (suite, sorted(runs))


def _plain(value: Any) -> Any:
    """python-hcl2's value with its string literals' quotes removed."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        # Interpolations keep their inner quotes, so only the outer pair goes.
        return value[1:-1]
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {_plain(key): _plain(item) for key, item in value.items()}
    return value


def _tf(name: str) -> dict[str, Any]:
    with (ROOT / "infra" / "terraform" / name).open() as handle:
        document: dict[str, Any] = _plain(hcl2.load(handle))
    return document


def _default(variable: str) -> Any:
    for block in _tf("variables.tf")["variable"]:
        if variable in block:
            return block[variable]["default"]
    raise KeyError(variable)


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("region", "us-east-1", "**us-east-1**"),
        ("cpu_instance_types", ["m7i.xlarge"], "`m7i.xlarge`"),
        ("redis_node_type", "cache.t4g.small", "`cache.t4g.small`"),
        ("single_nat_gateway", True, "`single_nat_gateway = true`"),
        ("availability_zone_letters", ["a", "b", "c"], "3 zones"),
        ("prometheus_volume_gib", 50, "`prometheus_volume_gib = 50`"),
        ("gpu_instance_types", ["g6.xlarge"], "`g6.xlarge`"),
        ("gpu_root_volume_gib", 150, "150 GiB"),
    ],
)
def test_the_eks_cost_table_prices_what_terraform_builds(
    variable: str, value: object, said: str
) -> None:
    """The cost page prices the Terraform defaults: a changed default must change it."""
    page = (DOCS / "operating" / "eks.md").read_text(encoding="utf-8")
    assert _default(variable) == value
    assert said in page


def test_the_eks_cost_table_counts_nodes_and_cache_clusters_as_built() -> None:
    page = (DOCS / "operating" / "eks.md").read_text(encoding="utf-8")
    assert _default("cpu_node_count")["desired"] == 2
    assert _default("gpu_node_count")["min"] == 0
    [redis] = [
        block["aws_elasticache_replication_group"]["state"]
        for block in _tf("redis.tf")["resource"]
        if "aws_elasticache_replication_group" in block
    ]
    assert redis["num_cache_clusters"] == 2
    assert "`num_cache_clusters = 2`" in page
    row = "| CPU nodes, `m7i.xlarge` (`cpu_instance_types`, `cpu_node_count.desired`) | 2 |"
    assert row in page


_REPOSITORY_PATH = re.compile(
    r"(?:bench|docs|deploy|docker|infra|monitoring|tests|control_plane|data_plane|runtimes"
    r"|foundation|activator|zeroserve|\.ci)(?:/[\w.*-]+)+/?"
)
_MADE_BY_THE_READER = {"infra/terraform/backend.tf"}
"""Files a page tells the reader to create."""


def test_every_repository_path_the_pages_name_exists() -> None:
    """The guides (the EKS one above all) name only files that are in the repository."""
    pages = [ROOT / "README.md", *DOCS.rglob("*.md")]
    named = {
        token
        for page in pages
        for token in re.findall(r"`([^`\s]+)`", page.read_text(encoding="utf-8"))
        if _REPOSITORY_PATH.fullmatch(token)
    }
    assert len(named) > 20
    for path in sorted(named - _MADE_BY_THE_READER):
        if path.startswith("bench/results/"):
            continue  # present or marked as history: the test above
        assert list(ROOT.glob(path.rstrip("/"))), path
