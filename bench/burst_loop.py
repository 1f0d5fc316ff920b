"""Run the burst-from-zero test many times in a row and count the runs that pass.

The test (``tests/integration/test_burst_e2e.py``) starts ``zeroserve up`` with two busy
loops beside it and sends two bursts of 200 requests at a scaled-to-zero model; a single
run in CI shows it works, this loop shows it keeps working (requests were once lost in 1
run of 8). Each run is a fresh pytest process; the output of every failed run is kept.

    python bench/burst_loop.py              # 50 runs, about 20-40 s each on 2 cores
    python bench/burst_loop.py --runs 5 --stop-on-failure

Exits 0 when every run passed, 1 otherwise; the last line says how many passed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
_TEST = "tests/integration/test_burst_e2e.py"
_RUN_TIMEOUT_S = 900.0
_TEARDOWN_TIMEOUT_S = 120.0


def run_once(index: int, out_dir: Path) -> bool:
    """One pytest run of the burst test; its output is kept in ``out_dir`` if it failed."""
    command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", _TEST]
    started = time.monotonic()
    # Its own session, so that a run past the timeout can be stopped with everything it
    # started (the platform, its workers, the busy loops) even if its teardown hangs.
    process = subprocess.Popen(
        command,
        cwd=_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # SIGINT first: pytest then runs the fixtures' teardown.
        os.killpg(process.pid, signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=_TEARDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
        output = f"timed out after {_RUN_TIMEOUT_S:g} s\n{output}"
    passed = process.returncode == 0
    bursts = [line for line in output.splitlines() if line.startswith("burst ")]
    verdict = "pass" if passed else "FAIL"
    print(
        f"run {index}: {verdict} in {time.monotonic() - started:.0f} s; {'; '.join(bursts)}",
        flush=True,
    )
    if not passed:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"run-{index}.log").write_text(output)
    return passed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="how many runs (default 50)")
    parser.add_argument("--stop-on-failure", action="store_true", help="stop at the first fail")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where failed runs' output goes (default bench/results/<UTC time>-burst_loop)",
    )
    args = parser.parse_args(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.out or _ROOT / "bench" / "results" / f"{stamp}-burst_loop"
    passed = 0
    for index in range(1, args.runs + 1):
        if run_once(index, out_dir):
            passed += 1
        elif args.stop_on_failure:
            break
    tail = "" if passed == args.runs else f"; failed runs' output in {out_dir}"
    print(f"{passed} of {args.runs} runs passed{tail}", flush=True)
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
