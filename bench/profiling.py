"""Where the server's time goes: a sampled profile under load, summarised as text.

``py-spy record --pid`` (non-blocking, all threads, raw collapsed stacks) attaches to the
running server while the load runs; the stacks are folded into own ("self") and cumulative
sample counts per function. Where py-spy cannot attach, the server is restarted under
``python -m cProfile`` (main thread only: the event loop, where the Python hot path runs) and
``pstats`` writes the same two rankings. Per-thread CPU from ``/proc/<pid>/task`` shows how
busy the event loop is compared with the engine's threads.
"""

from __future__ import annotations

import io
import os
import pstats
import re
import shutil
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench.loadgen import LoadGenerator, LoadResult, Target
from bench.models import RequestBody
from bench.server import ServerProcess, free_port, infer_once, server_command

_FRAME: Final = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_THREAD: Final = re.compile(r"^thread \((?P<tid>\w+)\)(?::\s*(?P<name>.*))?$")
SAMPLE_RATE_HZ: Final = 200


@dataclass(frozen=True)
class Folded:
    """Sample counts folded from py-spy's raw (collapsed-stack) output."""

    total: int
    own: Counter[str]
    cumulative: Counter[str]
    threads: Counter[str]
    thread_names: dict[int, str]


@dataclass(frozen=True)
class ProfileRun:
    """What to profile: one model under one load, and where to put the intermediate files."""

    repository: Path
    model: str
    body: RequestBody
    loadgen: LoadGenerator
    concurrency: int
    duration_s: int
    warmup_s: int
    workdir: Path
    method: str
    """``auto`` (py-spy, else cProfile), ``py-spy`` or ``cprofile``."""
    native: bool
    top: int


@dataclass(frozen=True)
class ProfileOutcome:
    """The report text, the raw profile to keep, and the commands that produced them."""

    text: str
    raw_path: Path | None
    commands: list[list[str]]


def profile(run: ProfileRun, repo_root: Path) -> ProfileOutcome:
    """Profile the server while ``run.loadgen`` drives it; py-spy first unless told otherwise."""
    notes: list[str] = []
    if run.method in ("auto", "py-spy"):
        if pyspy_available():
            outcome = _profile_pyspy(run, repo_root, notes)
            if outcome is not None:
                return outcome
        else:
            notes.append("py-spy is not installed (pip install py-spy)")
        if run.method == "py-spy":
            raise RuntimeError("py-spy profile failed: " + "; ".join(notes))
    return _profile_cprofile(run, notes)


def _profile_pyspy(run: ProfileRun, repo_root: Path, notes: list[str]) -> ProfileOutcome | None:
    port = free_port()
    command = server_command(run.repository, port, [run.model])
    raw = run.workdir / "pyspy-raw.txt"
    with ServerProcess(command, port, run.workdir / "server-pyspy.log") as server:
        _warm(run, port)
        spy_command = pyspy_command(server.pid, raw, run.duration_s, native=run.native)
        spy = subprocess.Popen(
            spy_command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            before = thread_cpu_seconds(server.pid)
            result = run.loadgen.run(
                _target(port, run.model),
                run.body,
                connections=run.concurrency,
                duration_s=run.duration_s,
            )
            after = thread_cpu_seconds(server.pid)
            spy_output, _ = spy.communicate(timeout=run.duration_s + 60)
        finally:
            if spy.poll() is None:
                spy.kill()
                spy.wait()
    if spy.returncode != 0 or not raw.is_file() or raw.stat().st_size == 0:
        notes.append(f"py-spy failed (exit {spy.returncode}): {spy_output.strip()[-500:]}")
        return None
    folded = fold_pyspy(raw, repo_root)
    text = "\n\n".join(
        [
            _load_text(
                run,
                result,
                "py-spy record --native (pauses the server per sample)"
                if run.native
                else "py-spy record --nonblocking (every thread)",
            ),
            thread_cpu_text(server.pid, before, after, result.duration_s, folded.thread_names),
            pyspy_text(folded, top=run.top),
        ]
    )
    return ProfileOutcome(text, raw, [command, spy_command])


def _profile_cprofile(run: ProfileRun, notes: list[str]) -> ProfileOutcome:
    port = free_port()
    output = run.workdir / "server.prof"
    command = server_command(
        run.repository, port, [run.model], python_args=["-m", "cProfile", "-o", str(output)]
    )
    # SIGINT, not SIGTERM: uvicorn re-raises the signal it handled after shutting down, and
    # only SIGINT (as KeyboardInterrupt) lets cProfile's `finally` write the profile.
    log = run.workdir / "server-cprofile.log"
    with ServerProcess(command, port, log, stop_signal=signal.SIGINT) as server:
        _warm(run, port)
        before = thread_cpu_seconds(server.pid)
        result = run.loadgen.run(
            _target(port, run.model),
            run.body,
            connections=run.concurrency,
            duration_s=run.duration_s,
        )
        after = thread_cpu_seconds(server.pid)
    # cProfile writes its file when the server exits, which leaving the block waited for.
    if not output.is_file():
        notes.append(f"cProfile wrote no profile:\n{server.log_tail()}")
        raise RuntimeError("; ".join(notes))
    parts = [_load_text(run, result, "cProfile (deterministic, main thread only)")]
    parts += [f"note: {note}" for note in notes]
    parts.append(thread_cpu_text(server.pid, before, after, result.duration_s, {}))
    parts.append(cprofile_text(output, top=run.top))
    return ProfileOutcome("\n\n".join(parts), None, [command])


def _warm(run: ProfileRun, port: int) -> None:
    infer_once(port, run.model, run.body)
    if run.warmup_s > 0:
        run.loadgen.run(
            _target(port, run.model), run.body, connections=run.concurrency, duration_s=run.warmup_s
        )


def _target(port: int, model: str) -> Target:
    return Target("127.0.0.1", port, f"/v2/models/{model}/infer")


def _load_text(run: ProfileRun, result: LoadResult, profiler: str) -> str:
    return (
        f"profiler: {profiler}\n"
        f"load: {run.model} MLP, {run.body.encoding} batch-1 requests, {run.concurrency} "
        f"connections, {run.duration_s} s, client {run.loadgen.name}\n"
        f"under the profiler: {result.throughput:.1f} infer/s, p50 {result.p50_ms:.2f} ms, "
        f"p99 {result.p99_ms:.2f} ms, errors {result.error_count}"
    )


def pyspy_available() -> bool:
    return shutil.which("py-spy") is not None


def pyspy_command(pid: int, output: Path, duration_s: int, *, native: bool) -> list[str]:
    command = ["py-spy", "record", "--pid", str(pid), "--rate", str(SAMPLE_RATE_HZ)]
    command += ["--duration", str(duration_s), "--format", "raw", "--threads", "-o", str(output)]
    # py-spy refuses --native without pausing the process for each sample; otherwise it reads
    # the stacks of the running process, which perturbs it least.
    command.append("--native" if native else "--nonblocking")
    return command


def fold_pyspy(raw_path: Path, repo_root: Path) -> Folded:
    """Own and cumulative samples per function (``name (file)``, lines merged), and per thread."""
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    thread_names: dict[int, str] = {}
    total = 0
    for line in raw_path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = "?"
        if match := _THREAD.match(frames[0]):
            frames = frames[1:]
            thread = (match.group("name") or match.group("tid")).strip()
            tid = match.group("tid")
            if tid.isdigit():
                thread_names[int(tid)] = thread
        total += count
        threads[thread] += count
        names = [_function(frame, repo_root) for frame in frames]
        if names:
            own[names[-1]] += count
        for name in set(names):
            cumulative[name] += count
    return Folded(total, own, cumulative, threads, thread_names)


def pyspy_text(folded: Folded, *, top: int) -> str:
    lines = [
        f"py-spy samples (active, all Python threads): {folded.total}",
        "",
        "samples by thread:",
    ]
    for thread, count in folded.threads.most_common():
        lines.append(f"  {_share(count, folded.total)}  {thread}")
    for title, counter in (("own", folded.own), ("cumulative", folded.cumulative)):
        lines += ["", f"top {top} functions by {title} samples (% of all samples):"]
        for name, count in counter.most_common(top):
            lines.append(f"  {_share(count, folded.total)}  {name}")
    return "\n".join(lines)


def cprofile_text(profile_path: Path, *, top: int) -> str:
    stream = io.StringIO()
    stats = pstats.Stats(str(profile_path), stream=stream)
    stats.strip_dirs()
    for key, title in (("tottime", "own"), ("cumulative", "cumulative")):
        stream.write(f"\ntop {top} functions by {title} time (cProfile, main thread):\n")
        stats.sort_stats(key).print_stats(top)
    return stream.getvalue()


def thread_cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) per thread of ``pid``: tid -> (comm, seconds)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    task_dir = Path(f"/proc/{pid}/task")
    for entry in task_dir.iterdir():
        try:
            text = (entry / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out[int(entry.name)] = (comm, (int(fields[11]) + int(fields[12])) / ticks)
    return out


def thread_cpu_text(
    pid: int,
    before: dict[int, tuple[str, float]],
    after: dict[int, tuple[str, float]],
    seconds: float,
    names: dict[int, str],
) -> str:
    """Cores each thread used between two :func:`thread_cpu_seconds` snapshots."""
    rows: list[tuple[float, str]] = []
    for tid, (comm, cpu) in after.items():
        used = cpu - before.get(tid, (comm, 0.0))[1]
        if used <= 0:
            continue
        if tid == pid:
            label = f"{tid} main thread (event loop)"
        elif tid in names:
            label = f"{tid} {names[tid]}"
        else:
            label = f"{tid} {comm} (no Python frames: ONNX Runtime intra-op pool or idle helper)"
        rows.append((used / seconds, label))
    rows.sort(reverse=True)
    total = sum(cores for cores, _ in rows)
    lines = [f"server CPU by thread during the load (cores; total {total:.2f}):"]
    lines += [f"  {cores:5.2f}  {label}" for cores, label in rows]
    return "\n".join(lines)


def _function(frame: str, repo_root: Path) -> str:
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match.group("file")
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    elif path.startswith(str(repo_root) + "/"):
        path = path[len(str(repo_root)) + 1 :]
    elif "/lib/python3" in path:
        path = "stdlib/" + path.split("/lib/python3", 1)[1].split("/", 1)[-1]
    return f"{match.group('func')} ({path})"


def _share(count: int, total: int) -> str:
    return f"{100.0 * count / total:5.1f}%" if total else "   - "
