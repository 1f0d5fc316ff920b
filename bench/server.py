"""The server under test: ``python -m data_plane`` as a subprocess on a free loopback port.

:class:`ServerProcess` is a context manager: leaving it (normally or by an exception) sends
SIGTERM, waits for the graceful shutdown, and kills the process if it overstays. The small
HTTP helpers here (readiness, stats, one verified request) use ``http.client``; they are not
on the timed path.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import numpy as np

from bench.models import OUTPUT_NAME, RequestBody

HOST: Final = "127.0.0.1"
REPO_ROOT: Final = Path(__file__).resolve().parents[1]


_LISTEN_PORTS: Final = range(20_000, 32_768)
"""Below Linux's default ephemeral range (32768-60999). A port the kernel hands out for
port 0 comes from that range, which is also where every outgoing connection takes its local
port: a client connecting between the pick and the server's bind can take the port, and
the server then fails with "Address already in use". Ports below it are never taken so."""


def free_port() -> int:
    """A loopback port nothing uses now, from below the ephemeral range (the server binds it
    moments later)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports nothing uses now (see ``free_port``)."""
    chosen: list[int] = []
    for port in random.sample(_LISTEN_PORTS, min(len(_LISTEN_PORTS), 64 * count)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
        chosen.append(port)
        if len(chosen) == count:
            return chosen
    raise OSError(f"no {count} free loopback ports found below the ephemeral range")


def server_command(
    repository: Path, port: int, models: Sequence[str], *, python_args: Sequence[str] = ()
) -> list[str]:
    """``python [python_args] -m data_plane ...`` loading ``models`` in explicit mode."""
    command = [sys.executable, *python_args, "-m", "data_plane"]
    command += ["--model-repository", str(repository), "--http-port", str(port)]
    command += ["--model-control-mode", "explicit", "--log-level", "warning"]
    # Metrics on the HTTP port: two servers of a comparison must not both claim 8002.
    command += ["--metrics-port", "0"]
    for model in models:
        command += ["--load-model", model]
    return command


class ServerProcess:
    """Runs ``command`` (a server on ``port``), waits until ready, stops it on exit."""

    def __init__(
        self,
        command: list[str],
        port: int,
        log_path: Path,
        *,
        start_timeout_s: float = 180.0,
        stop_timeout_s: float = 30.0,
        pin_cpus: str | None = None,
        stop_signal: signal.Signals = signal.SIGTERM,
    ) -> None:
        self.command = ["taskset", "-c", pin_cpus, *command] if pin_cpus else command
        self.port = port
        self._log_path = log_path
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._stop_signal = stop_signal
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("server not started")
        return self._process.pid

    def __enter__(self) -> Self:
        with self._log_path.open("wb") as log:
            self._process = subprocess.Popen(
                self.command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> int | None:
        """The stop signal, a wait for the drain, then SIGKILL; returns the exit status."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(self._stop_signal)
            try:
                process.wait(timeout=self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        return process.returncode

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self._log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        """User + system CPU the server process (all its threads) has used so far."""
        return process_cpu_seconds(self.pid)

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self._start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"server exited with status {self._process.returncode} before it was "
                    f"ready:\n{self.log_tail()}"
                )
            try:
                status, _, _ = request(self.port, "GET", "/v2/health/ready", timeout_s=2.0)
            except OSError:
                status = 0
            if status == 200:
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"server not ready after {self._start_timeout_s:.0f} s:\n{self.log_tail()}"
        )


def request(
    port: int,
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request on a fresh connection: status, lower-cased headers, body."""
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout_s)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        payload = response.read()
        answer_headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, answer_headers, payload
    finally:
        connection.close()


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU the process ``pid`` (all its threads) has used so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    # Fields 14 and 15 of proc(5) (utime, stime) sit at 11 and 12 after the comm field.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_by_parent() -> dict[int, list[int]]:
    """Every live process's pid under its parent's, from one scan of ``/proc`` (no
    CONFIG_PROC_CHILDREN needed)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    return parents


def process_tree_cpu_seconds(root: int) -> float:
    """CPU seconds used so far by ``root`` and its live descendants (a worker and its engine
    process, a server and its workers; exited ones are lost, so measure while they live)."""
    parents = children_by_parent()
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        try:
            total += process_cpu_seconds(pid)
        except OSError:
            continue
        stack.extend(parents.get(pid, ()))
    return total


@dataclass(frozen=True)
class ModelCounts:
    """Triton statistics counters of one model."""

    inference_count: int
    execution_count: int


def model_counts(port: int, model: str) -> ModelCounts:
    """``GET /v2/models/{model}/stats``: inferences (rows) and executions (batches) so far."""
    status, _, payload = request(port, "GET", f"/v2/models/{model}/stats")
    if status != 200:
        raise RuntimeError(f"stats of {model} answered {status}: {payload[:200]!r}")
    stats = json.loads(payload)["model_stats"][0]
    return ModelCounts(int(stats["inference_count"]), int(stats["execution_count"]))


def infer_once(
    port: int, model: str, body: RequestBody, *, extra_headers: dict[str, str] | None = None
) -> np.ndarray:
    """Post ``body`` once (with ``extra_headers``) and decode ``OUTPUT0``; raises unless the
    answer is a 200."""
    headers = {"Content-Type": body.content_type, **(extra_headers or {})}
    if body.header_length is not None:
        headers["Inference-Header-Content-Length"] = str(body.header_length)
    status, answer_headers, payload = request(
        port, "POST", f"/v2/models/{model}/infer", body=body.body, headers=headers
    )
    if status != 200:
        raise RuntimeError(f"{body.encoding} infer on {model} answered {status}: {payload[:300]!r}")
    header_length = answer_headers.get("inference-header-content-length")
    split = int(header_length) if header_length is not None else len(payload)
    document: dict[str, Any] = json.loads(payload[:split])
    output = next(o for o in document["outputs"] if o["name"] == OUTPUT_NAME)
    if output["datatype"] != "FP32":
        raise RuntimeError(f"{OUTPUT_NAME} of {model} is {output['datatype']}, not FP32")
    shape = tuple(int(d) for d in output["shape"])
    size = output.get("parameters", {}).get("binary_data_size")
    if size is None:
        return np.asarray(output["data"], dtype=np.float32).reshape(shape)
    if header_length is None:
        raise RuntimeError("binary output without Inference-Header-Content-Length")
    raw = payload[split : split + int(size)]
    return np.frombuffer(raw, dtype="<f4").reshape(shape)


def exit_on_sigterm() -> None:
    """Make SIGTERM a SystemExit in the main thread, so that a benchmark stopped that way
    still stops its servers and removes what it made on the way out (the default action
    skips all of that)."""

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)
