"""The code style gates run as part of the test suite, so CI cannot pass with them red."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["data_plane", "runtimes", "control_plane", "activator", "zeroserve", "bench", "tests"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_check():
    result = _run("ruff", "check", *PACKAGES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format():
    result = _run("ruff", "format", "--check", *PACKAGES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict():
    result = _run("mypy", *PACKAGES)
    assert result.returncode == 0, result.stdout + result.stderr
