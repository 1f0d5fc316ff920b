"""``bench/sequence.py --quick`` runs end to end against the server it starts (what CI runs
of it, so that it does not rot): every way's answers were checked against numpy, and it
printed its table. Nothing is saved; no speed is checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_finishes_and_reports(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sequence.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    for way in ("direct", "oldest", "client_state"):
        assert f"{way}: a sequence's answers checked against numpy" in output, output[-4000:]
        assert f"| {way} |" in output, output[-4000:]
    assert "results:" not in output, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
