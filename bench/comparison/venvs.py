"""The peers' virtual environments: one per peer, under the benchmark's cache folder.

Each peer gets ``python -m venv`` and ``pip install`` of its pinned packages plus the
ONNX Runtime version this interpreter has (the same engine for every server). A finished
environment is marked with the package list it holds and reused by later runs; a changed
list builds a new folder. Installs run in parallel (they mostly wait on the network).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Final

INSTALL_TIMEOUT_S: Final = 1200.0
_MARKER: Final = "zeroserve-bench-installed.txt"


class PeerUnavailableError(RuntimeError):
    """A peer's environment could not be built; the message says why."""


@dataclass(frozen=True)
class PeerPackages:
    """What one peer's environment holds."""

    name: str
    packages: tuple[str, ...]


def peer_packages(device: str) -> dict[str, PeerPackages]:
    """MLServer 1.7.1 (which needs ``uvloop<0.22``) and KServe's Python server, each with
    this interpreter's ONNX Runtime version (the GPU build for ``device == "cuda"``)."""
    ort = metadata.version("onnxruntime")
    engine = f"onnxruntime-gpu=={ort}" if device == "cuda" else f"onnxruntime=={ort}"
    return {
        "mlserver": PeerPackages("mlserver", ("mlserver==1.7.1", "uvloop<0.22", engine)),
        "kserve": PeerPackages("kserve", ("kserve==0.21.0", engine)),
    }


@dataclass(frozen=True)
class PeerEnv:
    """A built environment: its interpreter and how long building it took (0 if reused)."""

    name: str
    python: Path
    install_s: float
    packages: tuple[str, ...]


def ensure_envs(
    cache_dir: Path, wanted: Mapping[str, PeerPackages]
) -> tuple[dict[str, PeerEnv], dict[str, str]]:
    """Build (or reuse) every wanted environment; returns the built ones and, for each that
    failed, why."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    envs: dict[str, PeerEnv] = {}
    failures: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=max(len(wanted), 1), thread_name_prefix="venv") as pool:
        futures = {name: pool.submit(_ensure, cache_dir, spec) for name, spec in wanted.items()}
        for name, future in futures.items():
            try:
                envs[name] = future.result()
            except PeerUnavailableError as exc:
                failures[name] = str(exc)
    return envs, failures


def _ensure(cache_dir: Path, spec: PeerPackages) -> PeerEnv:
    digest = hashlib.sha256("\n".join(spec.packages).encode()).hexdigest()[:12]
    root = cache_dir / f"{spec.name}-{digest}"
    python = root / "bin" / "python"
    marker = root / _MARKER
    if marker.is_file() and python.is_file():
        return PeerEnv(spec.name, python, 0.0, spec.packages)
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", "--clear", str(root)], f"venv for {spec.name}")
    _run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *spec.packages],
        f"pip install {' '.join(spec.packages)}",
    )
    marker.write_text("\n".join(spec.packages) + "\n", encoding="utf-8")
    return PeerEnv(spec.name, python, time.monotonic() - started, spec.packages)


def _run(command: Sequence[str], what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PeerUnavailableError(f"{what}: not done after {INSTALL_TIMEOUT_S:.0f} s") from None
    except OSError as exc:
        raise PeerUnavailableError(f"{what}: {exc}") from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise PeerUnavailableError(f"{what} failed (exit {done.returncode}):\n{tail}")
