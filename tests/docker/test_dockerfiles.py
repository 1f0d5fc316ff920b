"""The Dockerfiles under docker/, parsed (no Docker daemon runs here, so none is built).

Checked: bases pinned by tag and digest, multi-stage builds whose final stage installs no
build tools and runs as a non-root user, ``COPY --from`` naming real stages and real
sources, and the runtime images running what the knative backend's pods run.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from control_plane.backends.knative.manifests import REPOSITORY_DIR, RUNTIME_UID
from control_plane.backends.knative.settings import KnativeSettings

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
RUNTIMES = [p for p in DOCKERFILES if p.name.startswith("runtime-")]
PINNED = re.compile(r"^[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}$")
# Packages that compile things: none may be installed in a final stage.
BUILD_TOOLS = re.compile(
    r"^(gcc|g\+\+|cpp|clang|llvm|make|cmake|ninja-build|build-essential|autoconf|automake|"
    r"libtool|pkg-config|git|cargo|rustc|gfortran|cuda-nvcc.*|.*-dev(el)?)(=.*)?$"
)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse(path: Path) -> list[Stage]:
    """Stages of a Dockerfile: continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, f"{path.name}: dangling line continuation"
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--platform")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif keyword == "ARG" and not stages:
            continue
        else:
            assert stages, f"{path.name}: {keyword} before FROM"
            stages[-1].instructions.append((keyword, args.strip()))
    return stages


def installed_packages(run: str) -> list[str]:
    """Package names an apt-get/apk/dnf/yum install in one RUN line asks for."""
    found: list[str] = []
    for command in re.split(r"&&|;|\|\|", run):
        words = shlex.split(command)
        for i, word in enumerate(words):
            is_install = (
                word == "install" and i > 0 and words[i - 1] in ("apt-get", "apt", "dnf", "yum")
            )
            if is_install or (word == "add" and i > 0 and words[i - 1] == "apk"):
                found += [w for w in words[i + 1 :] if not w.startswith("-")]
    return found


def test_there_are_the_three_images():
    assert {p.name for p in DOCKERFILES} == {
        "platform.Dockerfile",
        "runtime-cuda.Dockerfile",
        "runtime-vllm.Dockerfile",
    }


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_bases_are_pinned_by_tag_and_digest(path: Path):
    stages = parse(path)
    names: set[str] = set()
    for stage in stages:
        assert stage.base in names or PINNED.match(stage.base), stage.base
        assert ":latest@" not in stage.base
        if stage.name:
            names.add(stage.name)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_multi_stage_and_the_final_stage_has_no_build_tools(path: Path):
    stages = parse(path)
    assert len(stages) >= 2, "build in one stage, run in another"
    final = stages[-1]
    for run in final.all("RUN"):
        tools = [p for p in installed_packages(run) if BUILD_TOOLS.match(p)]
        assert tools == [], f"build tools in the final stage: {tools}"
        if re.search(r"\bpip install\b", run):
            assert "--only-binary=:all:" in run, "a final-stage pip install must not compile"
    names = {s.name for s in stages[:-1] if s.name}
    for copy in final.all("COPY"):
        source = re.search(r"--from=(\S+)", copy)
        if source:
            assert source.group(1) in names, copy


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_the_final_stage_runs_as_a_non_root_user(path: Path):
    final = parse(path)[-1]
    users = final.all("USER")
    assert users, "the final stage must switch to a non-root user"
    # The last USER is the one the container runs as.
    user = users[-1].split(":")[0]
    assert user not in ("root", "0") and user.isdigit() and int(user) == RUNTIME_UID


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_sources_copied_exist_and_are_not_ignored(path: Path):
    ignore = (DOCKER / f"{path.name}.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for stage in parse(path):
        for copy in stage.all("COPY"):
            if "--from=" in copy:
                continue
            *sources, _ = shlex.split(copy)
            for source in sources:
                assert (ROOT / source).exists(), source
                assert source.rstrip("/") in allowed, f"{source} is excluded by the dockerignore"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_entrypoint_is_exec_form(path: Path):
    final = parse(path)[-1]
    (entrypoint,) = final.all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["zeroserve"]


@pytest.mark.parametrize("path", RUNTIMES, ids=lambda p: p.name)
def test_runtime_images_run_what_the_knative_pods_run(path: Path):
    final = parse(path)[-1]
    (cmd,) = final.all("CMD")
    argv = json.loads(cmd)
    assert argv[0] == "serve"
    assert argv[argv.index("--model-control-mode") + 1] == "explicit"
    assert argv[argv.index("--model-repository") + 1] == REPOSITORY_DIR
    assert argv[argv.index("--cache-dir") + 1] == KnativeSettings().cache_dir
    run = " ".join(final.all("RUN"))
    assert f"chown {RUNTIME_UID}:{RUNTIME_UID} {REPOSITORY_DIR}" in run


def test_the_parser_sees_what_it_must_refuse(tmp_path: Path):
    """The checks are not vacuous: a compiler, an unpinned base and root are all found."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text(
        "FROM python:3.11 AS build\nRUN true\n"
        "FROM python:3.11\nRUN apt-get update && apt-get install -y --no-install-recommends \\\n"
        "    gcc libssl-dev curl\nUSER root\n"
    )
    build, final = parse(bad)
    assert not PINNED.match(build.base)
    assert [p for p in installed_packages(final.all("RUN")[0]) if BUILD_TOOLS.match(p)] == [
        "gcc",
        "libssl-dev",
    ]
    assert final.all("USER") == ["root"]


def test_the_vllm_image_installs_under_vllms_constraints_and_checks_them():
    """zeroserve goes into vLLM's image constrained by what vLLM declares, then pip check
    fails the build on a conflict; the engine core starts by spawn."""
    final = parse(DOCKER / "runtime-vllm.Dockerfile")[-1]
    env = " ".join(final.all("ENV"))
    assert "VLLM_WORKER_MULTIPROC_METHOD=spawn" in env
    (install,) = [run for run in final.all("RUN") if "pip install" in run]
    steps = [shlex.split(step) for step in install.split("&&")]
    (write,) = [s for s in steps if s[:2] == ["python3", "/tmp/vllm_constraints.py"]]
    assert write[2:4] == ["vllm", "torch"]
    (pip,) = [s for s in steps if s[2:4] == ["pip", "install"]]
    assert pip[pip.index("--constraint") + 1] == "/tmp/vllm-constraints.txt"
    assert ["python3", "-m", "pip", "check"] in steps
    order = [steps.index(write), steps.index(pip), steps.index(["python3", "-m", "pip", "check"])]
    assert order == sorted(order)
    assert "docker/vllm_constraints.py /tmp/vllm_constraints.py" in final.all("COPY")


def test_the_constraints_pin_the_named_and_keep_the_first_ones_ranges():
    """docker/vllm_constraints.py on an installed distribution here (the kubernetes client
    stands in for vLLM, which is not installed): pins, its declared ranges, extras left out."""
    import importlib.util
    from importlib import metadata

    spec = importlib.util.spec_from_file_location(
        "vllm_constraints", DOCKER / "vllm_constraints.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines = module.constraints(["kubernetes", "urllib3"])
    assert f"kubernetes=={metadata.version('kubernetes')}" in lines
    assert f"urllib3=={metadata.version('urllib3')}" in lines
    assert any(line.startswith("python-dateutil>=") for line in lines)
    assert not any(line.startswith("google-auth") for line in lines)  # an extra's
    assert len({line.split("=")[0].split(">")[0].split("<")[0] for line in lines}) == len(lines)
