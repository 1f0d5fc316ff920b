"""Real Triton 2.51, installed and run: the oracle of the differential tests
(``tests/triton_oracle.py``) and the peer of the benchmarks.

The ``nvidia-pytriton`` 0.7.0 wheel (PyPI) carries the ``tritonserver`` 2.51 binary and its
Python backend, and nothing else (no ONNX backend): the models given to it are Python-backend
``model.py`` files in Triton's form (``triton_python_backend_utils``). :func:`triton_install`
puts the wheel, unpacked, into a cache folder the first time (``pip download``), adds the
Python 3.11 backend stub and makes ``numpy<2`` visible to the stub, which embeds the system's
``libpython3.11`` (Debian's) and so reads that interpreter's ``dist-packages``: a ``.pth``
file there names a folder holding numpy. Where any of that cannot be done (no system Python
3.11, no network, another platform) it returns the reason instead.

:func:`run_triton` starts the server on free loopback ports with a given repository and
stops it on exit, whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench import wheel_cache
from bench.server import free_ports

PYTRITON_VERSION = "0.7.0"
"""The nvidia-pytriton release that ships Triton 2.51 (release r24.10)."""
SYSTEM_PYTHON = Path("/usr/bin/python3.11")
"""The interpreter whose libpython the 3.11 backend stub embeds."""
SYSTEM_SITE = Path("/usr/local/lib/python3.11/dist-packages")
"""Where that interpreter (and so the stub) reads ``.pth`` files."""
PTH_NAME = "zeroserve_triton_oracle.pth"
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH for Triton: no pyenv or virtualenv Python ahead of the system's."""
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
INSTALL_TIMEOUT_S = 600.0

ADD_SUB_MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""
"""Triton's "simple" model as a Python-backend ``model.py``: ``OUTPUT0 = INPUT0 + INPUT1``,
``OUTPUT1 = INPUT0 - INPUT1``."""


def cache_dir() -> Path:
    """Where the unpacked wheel and the stub's numpy live between runs."""
    return wheel_cache.cache_dir(f"triton-oracle-{PYTRITON_VERSION}")


@dataclass(frozen=True)
class TritonInstall:
    """An unpacked wheel ready to run: the server binary and its backends folder."""

    root: Path

    @property
    def binary(self) -> Path:
        return self.root / "pytriton" / "tritonserver" / "bin" / "tritonserver"

    @property
    def backends(self) -> Path:
        return self.root / "pytriton" / "tritonserver" / "backends"

    @property
    def caches(self) -> Path:
        """Triton's cache implementations (``local``), for ``--cache-directory``: the
        binary looks in /opt/tritonserver/caches unless told."""
        return self.root / "pytriton" / "tritonserver" / "caches"

    @property
    def stub(self) -> Path:
        return self.backends / "python" / "triton_python_backend_stub"

    def is_complete(self) -> bool:
        return os.access(self.binary, os.X_OK) and os.access(self.stub, os.X_OK)


def _run(args: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        list(args), capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, **kwargs
    )


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = CLEAN_PATH
    return env


def _stub_numpy_version() -> str | None:
    """The numpy version the stub's Python imports, None if it imports none."""
    done = _run(
        [str(SYSTEM_PYTHON), "-c", "import numpy; print(numpy.__version__)"], env=_clean_env()
    )
    return done.stdout.strip() if done.returncode == 0 else None


def _make_numpy_visible(cache: Path) -> str | None:
    """Give the stub's Python numpy<2 (the backend's utilities need numpy; the 2.51 stub
    was built against numpy 1); None when done, else why not."""
    found = _stub_numpy_version()
    if found is not None and int(found.split(".")[0]) < 2:
        return None
    target = cache / "pydeps"
    done = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--target",
            str(target),
            "numpy<2",
        ]
    )
    if done.returncode != 0:
        return f"pip could not install numpy<2 for the backend stub: {done.stderr[-500:]}"
    try:
        (SYSTEM_SITE / PTH_NAME).write_text(f"{target}\n")
    except OSError as exc:
        return f"cannot make numpy visible to the stub through {SYSTEM_SITE}: {exc}"
    found = _stub_numpy_version()
    if found is None or int(found.split(".")[0]) >= 2:
        return f"the stub's Python still sees numpy {found} after adding {PTH_NAME}"
    return None


def _unpack(cache: Path) -> str | None:
    download = cache / "download"
    download.mkdir(parents=True, exist_ok=True)
    pattern = f"nvidia_pytriton-{PYTRITON_VERSION}-*.whl"
    if not list(download.glob(pattern)):
        reason = wheel_cache.pip_download(
            download,
            f"nvidia-pytriton=={PYTRITON_VERSION}",
            pattern,
            only_binary=False,
            timeout_s=INSTALL_TIMEOUT_S,
        )
        if reason is not None:
            return reason
    wheels = list(download.glob(pattern))
    staging = cache / "unpacking"
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(staging)
    install = TritonInstall(staging)
    stub_source = (
        staging / "pytriton" / "tritonserver" / "python_backend_stubs" / "3.11" / install.stub.name
    )
    if not stub_source.is_file():
        return f"the wheel has no Python 3.11 backend stub at {stub_source}"
    shutil.copy2(stub_source, install.stub)
    # Zip archives keep no modes: the binaries must be made executable again.
    for path in (install.binary, install.stub):
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    final = cache / "wheel"
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return None


def triton_install() -> TritonInstall | str:
    """Triton 2.51 ready to run, installed into :func:`cache_dir` if needed; or the reason
    it cannot run here."""
    if not sys.platform.startswith("linux"):
        return "the tritonserver binary in nvidia-pytriton runs on Linux only"
    if not SYSTEM_PYTHON.is_file():
        return f"the Python backend stub needs the system's Python 3.11 ({SYSTEM_PYTHON})"
    cache = cache_dir()
    install = TritonInstall(cache / "wheel")
    try:
        with wheel_cache.install_lock(cache):
            if not install.is_complete():
                reason = _unpack(cache)
                if reason is not None:
                    return reason
            reason = _make_numpy_visible(cache)
    except (OSError, subprocess.SubprocessError, zipfile.BadZipFile) as exc:
        return f"installing Triton {PYTRITON_VERSION} failed: {exc!r}"
    if reason is not None:
        return reason
    return install


@dataclass
class TritonServer:
    """A running Triton: its ports and its log."""

    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log_path: Path
    metrics_port: int

    @property
    def grpc_address(self) -> str:
        """host:port, the form tritonclient and grpc channels take."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        """Where Triton serves ``/metrics`` (a port of its own)."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)


@contextlib.contextmanager
def run_triton(
    install: TritonInstall,
    repository: Path,
    log_dir: Path,
    *args: str,
) -> Iterator[TritonServer]:
    """Triton serving ``repository`` on free ports until the block ends; ``args`` are more
    ``tritonserver`` flags (``--model-control-mode=explicit``...). Waits for the server
    to answer ready (every model loaded); raises with the log if it exits or never does."""
    http_port, grpc_port, metrics_port = free_ports(3)
    log_path = log_dir / f"triton-{grpc_port}.log"
    command = [
        str(install.binary),
        f"--model-repository={repository}",
        f"--backend-directory={install.backends}",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        # The Python backend's shared-memory regions are named by this prefix; two servers
        # with the default one on a machine (tests side by side) break each other's locks.
        f"--backend-config=python,shm-region-prefix-name={_shm_prefix(grpc_port)}",
        *args,
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_clean_env(),
            cwd=install.root,
        )
    server = TritonServer(process, http_port, grpc_port, log_path, metrics_port)
    try:
        _wait_ready(server)
        yield server
    finally:
        _stop(process)
        _remove_regions(_shm_prefix(grpc_port))


def _shm_prefix(grpc_port: int) -> str:
    return f"zeroserve_oracle_{grpc_port}_"


def _remove_regions(prefix: str) -> None:
    # Triton leaves its stubs' regions in /dev/shm when it is killed or a model fails to
    # initialize; the prefix is this server's alone, so what is left under it is garbage.
    for region in Path("/dev/shm").glob(f"{prefix}*"):
        region.unlink(missing_ok=True)


def _wait_ready(server: TritonServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"tritonserver exited with {server.process.returncode}:\n{server.log()}"
            )
        try:
            ready = httpx.get(f"{server.http_url}/v2/health/ready", timeout=2.0)
            if ready.status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"tritonserver not ready within {START_TIMEOUT_S} s:\n{server.log()}")
