"""Every benchmark script's ``--quick`` run (what CI runs of them, so that none rots).

Each runs end to end against the real servers it starts, with nothing saved; only that it
finished, printed its report and saw no errors is checked, never how fast anything was.
``bench/compare.py --quick`` has its own test (``test_compare.py``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("script", "extra", "needs", "printed"),
    [
        pytest.param("data_plane.py", [], "wrk", "targets:", id="data_plane"),
        pytest.param("activator.py", [], None, "targets:", id="activator"),
        pytest.param("activator.py", ["--keys"], None, "keys and quotas", id="activator-keys"),
        pytest.param(
            "grpc_activator.py", ["--client", "grpcio"], None, "added p50", id="grpc_activator"
        ),
        pytest.param("llm.py", [], None, "targets:", id="llm"),
        pytest.param("loadgen_ceiling.py", [], None, "ceiling", id="loadgen_ceiling"),
        pytest.param("scale_from_zero.py", [], None, "targets:", id="scale_from_zero"),
        pytest.param("cold_start.py", [], "s3rver", "floor", id="cold_start"),
        pytest.param("keepalive.py", [], None, "oracle distance", id="keepalive"),
    ],
)
def test_quick_run_finishes_and_reports(
    script: str, extra: list[str], needs: str | None, printed: str, tmp_path: Path
) -> None:
    if needs is not None and shutil.which(needs) is None:
        pytest.skip(f"{script} needs {needs}, which is not installed")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick", "--no-save", *extra],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert printed in output, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
