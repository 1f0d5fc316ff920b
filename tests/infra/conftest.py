"""checkov in a virtual environment of its own, cached under ~/.cache.

checkov pins boto3 and packaging to versions older than zeroserve's, so installing it next
to the project would downgrade them; it gets its own venv, built once per machine (about a
minute, from PyPI) and reused. The build runs under a file lock and is marked complete only
at its end, so a second test process waits for it and an interrupted build is redone.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOV_VERSION = "3.3.30"
CACHE = Path.home() / ".cache" / "zeroserve"
INSTALL_TIMEOUT_S = 600


@pytest.fixture(scope="session")
def checkov() -> Path:
    """Path of a working ``checkov`` executable."""
    venv = CACHE / f"checkov-{CHECKOV_VERSION}"
    complete = venv / ".complete"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / f"checkov-{CHECKOV_VERSION}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not complete.exists():
            shutil.rmtree(venv, ignore_errors=True)
            _build(venv)
            complete.touch()
    return venv / "bin" / "checkov"


def _build(venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
    result = subprocess.run(
        [*pip, f"checkov=={CHECKOV_VERSION}"],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    if result.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        raise RuntimeError(f"installing checkov failed:\n{result.stdout}\n{result.stderr}")
