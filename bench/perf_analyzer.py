"""Triton's ``perf_analyzer`` 2.51, installed and run: the client Triton users measure
servers with, for the benchmarks and the test suite's smoke run.

The binary ships inside the PyPI wheel ``tritonclient==2.51.0``
(``tritonclient-2.51.0.data/data/bin/perf_analyzer``). It links Debian's ``libb64.so.0d``
(apt package ``libb64-0d``) and ``libcudart.so.12`` (no GPU needed: it only loads), which the
pip package ``nvidia-cuda-runtime-cu12`` carries. :func:`perf_analyzer_install` puts both
wheels' files into a cache folder the first time (``pip download``) and returns the binary
with its library folder, or the reason it cannot run here (another platform, no libb64, no
network for the first download).

:func:`run_point` runs one measurement (a model, a protocol, a concurrency, sync or
``--async``, optionally ``--streaming`` or ``--shared-memory system``) and parses the CSV
report perf_analyzer writes with ``-f``; a run perf_analyzer reports as failed (a non-zero
exit, an error line) raises :class:`PerfAnalyzerError` with its output.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes.util
import io
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from bench import wheel_cache

TRITONCLIENT_VERSION: Final = "2.51.0"
CUDA_RUNTIME_VERSION: Final = "12.9.79"
"""The ``nvidia-cuda-runtime-cu12`` release whose ``libcudart.so.12`` the binary loads."""
BINARY_MEMBER: Final = f"tritonclient-{TRITONCLIENT_VERSION}.data/data/bin/perf_analyzer"
CUDART_MEMBER: Final = "nvidia/cuda_runtime/lib/libcudart.so.12"
INSTALL_TIMEOUT_S: Final = 600.0

Protocol = Literal["http", "grpc"]


class PerfAnalyzerError(Exception):
    """perf_analyzer reported an error (or wrote no report); ``str()`` carries its output."""


def cache_dir() -> Path:
    """Where the binary and its library live between runs."""
    return wheel_cache.cache_dir(f"perf-analyzer-{TRITONCLIENT_VERSION}")


@dataclass(frozen=True)
class PerfAnalyzerInstall:
    """The unpacked binary and the folder holding ``libcudart.so.12``."""

    root: Path

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "perf_analyzer"

    @property
    def lib_dir(self) -> Path:
        return self.root / "lib"

    def env(self) -> dict[str, str]:
        """The environment to run the binary in: ours, with its library folder first."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            filter(None, [str(self.lib_dir), env.get("LD_LIBRARY_PATH")])
        )
        return env

    def is_complete(self) -> bool:
        return os.access(self.binary, os.X_OK) and (self.lib_dir / "libcudart.so.12").is_file()


def _extract(wheel_glob: str, member: str, download: Path, target: Path) -> str | None:
    wheels = sorted(download.glob(wheel_glob))
    if not wheels:
        return f"no wheel matching {wheel_glob} in {download}"
    with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(member) as source:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as out:
            shutil.copyfileobj(source, out)
    return None


def _unpack(cache: Path) -> str | None:
    download = cache / "download"
    download.mkdir(parents=True, exist_ok=True)
    wanted = (
        (f"tritonclient=={TRITONCLIENT_VERSION}", f"tritonclient-{TRITONCLIENT_VERSION}-*.whl"),
        (
            f"nvidia-cuda-runtime-cu12=={CUDA_RUNTIME_VERSION}",
            f"nvidia_cuda_runtime_cu12-{CUDA_RUNTIME_VERSION}-*.whl",
        ),
    )
    for requirement, pattern in wanted:
        if not list(download.glob(pattern)):
            reason = wheel_cache.pip_download(
                download, requirement, pattern, only_binary=True, timeout_s=INSTALL_TIMEOUT_S
            )
            if reason is not None:
                return reason
    staging = cache / "unpacking"
    shutil.rmtree(staging, ignore_errors=True)
    install = PerfAnalyzerInstall(staging)
    for (_, pattern), member, target in zip(
        wanted,
        (BINARY_MEMBER, CUDART_MEMBER),
        (install.binary, install.lib_dir / "libcudart.so.12"),
        strict=True,
    ):
        reason = _extract(pattern, member, download, target)
        if reason is not None:
            return reason
    # Zip archives keep no modes: the binary must be made executable again.
    install.binary.chmod(install.binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP)
    final = cache / "install"
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return None


def perf_analyzer_install() -> PerfAnalyzerInstall | str:
    """perf_analyzer 2.51 ready to run, installed into :func:`cache_dir` if needed; or the
    reason it cannot run here."""
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return "the perf_analyzer in tritonclient's wheel is built for Linux x86_64 only"
    if ctypes.util.find_library("b64") is None:
        return "perf_analyzer needs Debian's libb64-0d (apt-get install libb64-0d)"
    cache = cache_dir()
    install = PerfAnalyzerInstall(cache / "install")
    try:
        with wheel_cache.install_lock(cache):
            if not install.is_complete():
                reason = _unpack(cache)
                if reason is not None:
                    return reason
    except (OSError, subprocess.SubprocessError, zipfile.BadZipFile, KeyError) as exc:
        return f"installing perf_analyzer {TRITONCLIENT_VERSION} failed: {exc!r}"
    done = subprocess.run(
        [str(install.binary), "--version"],
        capture_output=True,
        text=True,
        env=install.env(),
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        return f"perf_analyzer does not start here: {(done.stdout + done.stderr)[-500:]}"
    return install


@dataclass(frozen=True)
class PerfPoint:
    """One measurement as perf_analyzer's CSV report gives it (latencies in µs)."""

    concurrency: int
    infer_per_s: float
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    avg_us: float
    server_queue_us: float
    server_compute_infer_us: float
    output: str
    """perf_analyzer's stdout and stderr."""


def parse_csv(text: str, output: str = "") -> PerfPoint:
    """The first row of perf_analyzer's ``-f`` report. PerfAnalyzerError without one."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise PerfAnalyzerError(f"perf_analyzer wrote no measurement:\n{output}")
    row = rows[0]

    def number(column: str) -> float:
        value = row.get(column)
        return float(value) if value not in (None, "") else 0.0

    return PerfPoint(
        concurrency=int(number("Concurrency")),
        infer_per_s=number("Inferences/Second"),
        p50_us=number("p50 latency"),
        p90_us=number("p90 latency"),
        p95_us=number("p95 latency"),
        p99_us=number("p99 latency"),
        avg_us=number("Avg latency"),
        server_queue_us=number("Server Queue"),
        server_compute_infer_us=number("Server Compute Infer"),
        output=output,
    )


def command(
    install: PerfAnalyzerInstall,
    *,
    model: str,
    url: str,
    protocol: Protocol,
    concurrency: int,
    report: Path,
    measurement_interval_ms: int = 2000,
    request_count: int | None = None,
    is_async: bool = False,
    is_streaming: bool = False,
    shared_memory: Literal["none", "system"] = "none",
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of one point. ``request_count`` measures that many requests once
    (no stability trials: a smoke run); otherwise ``measurement_interval_ms`` windows until
    stable, as perf_analyzer's default."""
    args = [
        str(install.binary),
        "-m",
        model,
        "-u",
        url,
        "-i",
        protocol,
        "--concurrency-range",
        str(concurrency),
        "-f",
        str(report),
        "--shared-memory",
        shared_memory,
    ]
    if request_count is not None:
        args += ["--request-count", str(request_count)]
    else:
        args += ["--measurement-interval", str(measurement_interval_ms)]
    if is_async:
        args.append("--async")
    if is_streaming:
        args.append("--streaming")
    return [*args, *extra]


def run_point(
    install: PerfAnalyzerInstall,
    *,
    model: str,
    url: str,
    protocol: Protocol,
    concurrency: int = 1,
    measurement_interval_ms: int = 2000,
    request_count: int | None = None,
    is_async: bool = False,
    is_streaming: bool = False,
    shared_memory: Literal["none", "system"] = "none",
    extra: Sequence[str] = (),
    timeout_s: float = 300.0,
) -> PerfPoint:
    """Run perf_analyzer once against ``url`` (``host:port``) and return its measurement.

    Raises PerfAnalyzerError when it exits non-zero, prints an error, or writes no report;
    subprocess.TimeoutExpired past ``timeout_s`` (the process is killed)."""
    with _report_path() as report:
        args = command(
            install,
            model=model,
            url=url,
            protocol=protocol,
            concurrency=concurrency,
            report=report,
            measurement_interval_ms=measurement_interval_ms,
            request_count=request_count,
            is_async=is_async,
            is_streaming=is_streaming,
            shared_memory=shared_memory,
            extra=extra,
        )
        done = subprocess.run(
            args, capture_output=True, text=True, env=install.env(), timeout=timeout_s
        )
        output = done.stdout + done.stderr
        if done.returncode != 0 or has_error(output):
            raise PerfAnalyzerError(
                f"perf_analyzer exited with {done.returncode}: {' '.join(args)}\n{output}"
            )
        text = report.read_text() if report.is_file() else ""
    return parse_csv(text, output)


def has_error(output: str) -> bool:
    """Whether perf_analyzer's output reports an error (it prints some, such as a failed
    request or a statistics mismatch, and still exits 0 in some versions)."""
    lowered = output.lower()
    return any(
        marker in lowered
        for marker in ("error:", "failed to", "thread [", "unexpected response", "got error")
    )


@contextlib.contextmanager
def _report_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as folder:
        yield Path(folder) / "report.csv"


UNSTABLE: Final = "Failed to obtain stable measurement"
STABILITY_STEPS: Final = (1, 2, 4)
"""A point that does not settle is measured again with this many times the stability
percentage: a busy 2-core machine rarely gives three windows within 25 % at c=8 and over."""


def run_settled_point(
    install: PerfAnalyzerInstall,
    *,
    stability_percentage: float,
    max_trials: int,
    **point: Any,
) -> tuple[PerfPoint, float]:
    """:func:`run_point` (``point`` its keyword arguments, less ``extra``) over windows
    that must agree within ``stability_percentage``, measured again at 2x and 4x that
    when perf_analyzer cannot settle; the point and the percentage it settled at.

    Raises PerfAnalyzerError when it settles at none of them, or fails otherwise."""
    for step in STABILITY_STEPS:
        stability = stability_percentage * step
        extra = ["--max-trials", str(max_trials), "--stability-percentage", str(stability)]
        try:
            return run_point(install, extra=extra, **point), stability
        except PerfAnalyzerError as exc:
            if UNSTABLE not in str(exc) or step == STABILITY_STEPS[-1]:
                raise
            print(f"  unstable at {stability:g} %; again at {stability * 2:g} %", flush=True)
    raise AssertionError("unreachable: the last step returns or raises")
