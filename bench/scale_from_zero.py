"""Scale-from-zero benchmark: time to the first response of a model with no replica.

The demo model (``data_plane.demo``, a 4->16->3 ONNX MLP) lives in an S3 bucket served by a
loopback ``moto_server``, and in a local folder. One request goes to the activator of a
``zeroserve up`` platform while the model has no replica, and the client times it to its
answer's last byte (verified against ONNX Runtime). Cases:

* ``cold_local`` — no worker at all (``--warm-workers 0``): a worker is forked from the
  platform's worker template (``data_plane.template``, which has imported the data plane),
  then loads the model from a local folder, read in place;
* ``cold_local_spawn`` — the same on a platform with the template off
  (``ZEROSERVE_CONTROL_PLANE_WORKER_TEMPLATE=false``): a new ``python -m data_plane``
  process starts, imports included;
* ``cold`` and ``cold_spawn`` — the same two, the model coming from the S3 bucket through
  the node cache (hit);
* ``warm_hit_fresh`` — an empty warm worker is waiting (``--warm-workers 1``), one that has
  never loaded a model (a new platform per run), and the node cache holds the model;
* ``warm_hit`` — the same, but the warm worker has served models before (the steady state of
  a model going to zero and back; its engine cache holds the model too);
* ``warm_miss`` — a used warm worker, but the model was just re-uploaded under a new S3
  prefix: the node cache misses and fetches it (the engine cache, keyed by the cached files,
  misses as well);
* ``warm_local`` — a used warm worker and a local folder as ``storage_uri``, read in place:
  no object storage at all, the floor of the warm path.

Pools have ``--max-workers 1``, so the warm worker is the one that serves and no replacement
warm worker starts up beside it during a run. The first activation (a cold start with a
cache miss, to fill the cache) is recorded but not counted. Between runs the model goes back
to zero through the admin API's unload, and the pool to its warm workers only (stopped
worker processes exited). The two cold platforms are up together and take turns, in the
other order each repeat, so that forked and spawned starts meet the same machine. Each run's
cold-start timeline is read from ``GET /admin/v1/models/{name}/activations``: worker start,
fetch, engine build, and the rest of the time to the answer (queueing before the activation,
the activator seeing the placement, the proxied request itself); a started worker's boot
(its process existing to its first liveness answer) and, since the machine is shared, the
CPU seconds the serving worker had used by its answer, the platform's CPU over the request
and the load average. Last, what a worker that is not forked pays first (the pod side: a
pod's container starts a new interpreter): a new interpreter's imports of the data plane,
of what the template preloads, and of torch, wall and CPU. Medians per case. Targets: both
warm hits, and a cold start from a local folder, <= 300 ms. Results go to
``bench/results/<UTC time>-<tag>-scale_from_zero.json``.

    python bench/scale_from_zero.py               # about 3.5 minutes
    python bench/scale_from_zero.py --quick       # smoke run, one run per case
    python bench/scale_from_zero.py --repeats 2   # smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench import engine as engine_module, machine, models, report
from bench.moto_server import CREDENTIALS, REGION, MotoServer, start_moto
from bench.platform_process import FAST_RESET_ENV, PlatformProcess, is_alive
from bench.server import REPO_ROOT, children_by_parent, infer_once, process_cpu_seconds
from data_plane.demo import DEMO_MODEL, DEMO_WIDTHS, write_demo_repository

RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
BUCKET: Final = "models"
COLD: Final = "cold"
COLD_SPAWN: Final = "cold_spawn"
COLD_LOCAL: Final = "cold_local"
COLD_LOCAL_SPAWN: Final = "cold_local_spawn"
WARM_FRESH: Final = "warm_hit_fresh"
WARM_HIT: Final = "warm_hit"
WARM_MISS: Final = "warm_miss"
WARM_LOCAL: Final = "warm_local"
CASES: Final = (
    COLD_LOCAL,
    COLD_LOCAL_SPAWN,
    COLD,
    COLD_SPAWN,
    WARM_FRESH,
    WARM_HIT,
    WARM_MISS,
    WARM_LOCAL,
)
TARGET_WARM_HIT_S: Final = 0.300
TARGET_COLD_LOCAL_S: Final = 0.300
TEMPLATE_OFF_ENV: Final = {"ZEROSERVE_CONTROL_PLANE_WORKER_TEMPLATE": "false"}
_TEMPLATE_MODULE: Final = b"data_plane.template"
_SPEC: Final = models.MlpSpec(DEMO_MODEL, DEMO_WIDTHS)
_BASE_URI: Final = f"s3://{BUCKET}/base/{DEMO_MODEL}"
_ENGINE_LOG: Final = re.compile(r"engine cache (hit|miss|off)")
_LOADED_LOG: Final = re.compile(rf"loaded {DEMO_MODEL} versions .+? in ([0-9.]+) s")
_FIRST_RESPONSE_WAIT_S: Final = 0.5
_REAPER_SPAWN_S: Final = 0.2


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--repeats", type=int, default=7, help="runs per case; medians")
    parser.add_argument(
        "--settle", type=float, default=0.5, help="quiet seconds before each timed request"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 repeat per case")
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
    if args.repeats < 1 or args.settle < 0:
        parser.error("--repeats must be >= 1 and --settle >= 0")
    return args


@dataclass
class _Bench:
    """What every run needs: the model's request and answer, the bucket, the folders."""

    workdir: Path
    moto: MotoServer
    body: models.RequestBody
    expected: np.ndarray
    local_dir: Path
    settle_s: float
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    seen_workers: set[str] = field(default_factory=set)
    noise_cores: float = 0.0
    """Busy CPU (cores) of the machine while the last run settled: other processes."""
    commands: dict[str, Any] = field(default_factory=dict)
    templates: dict[str, Any] = field(default_factory=dict)
    """platform name -> its worker template's pid and CPU seconds (its imports, mostly)."""

    def platform(
        self, name: str, warm_workers: int, env: dict[str, str] | None = None
    ) -> PlatformProcess:
        platform = PlatformProcess(
            self.workdir,
            cache_dir=self.workdir / "cache",
            allowed_storage=(f"s3://{BUCKET}", str(self.local_dir.parent)),
            # One worker at most: the warm worker is always the one that serves, and the
            # reaper does not start a replacement (a second process starting up on a
            # 2-core machine) while the model holds it.
            max_workers=1,
            warm_workers=warm_workers,
            env={
                "AWS_ENDPOINT_URL": self.moto.url,
                "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
                "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
                "AWS_DEFAULT_REGION": REGION,
                **FAST_RESET_ENV,
                **(env or {}),
            },
            name=name,
        )
        self.commands[name] = platform.command
        return platform


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    started = time.monotonic()
    started_utc = datetime.now(UTC)
    stamp = started_utc.strftime("%Y-%m-%dT%H%M%SZ")
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", args.tag or socket.gethostname()).strip("-") or "host"
    with tempfile.TemporaryDirectory(prefix="zeroserve-bench-s2z-") as tmp:
        workdir = Path(tmp)
        local_dir = write_demo_repository(workdir / "local")
        row = models.sample_rows(_SPEC, 1)
        expected = engine_module.Engine(local_dir / "1" / "model.onnx").run(row)
        moto = start_moto(workdir)
        try:
            bench = _Bench(
                workdir=workdir,
                moto=moto,
                body=models.request_body(_SPEC, row, "binary"),
                expected=expected,
                local_dir=local_dir,
                settle_s=args.settle,
            )
            bench.commands["moto"] = [sys.executable, "-m", "moto.server", "-p", str(moto.port)]
            s3 = moto.client()
            s3.create_bucket(Bucket=BUCKET)
            _upload(s3, local_dir, "base")
            _cold_phase(bench, args.repeats)
            _fresh_phase(bench, args.repeats)
            _warm_phase(bench, args.repeats)
            # --quick (what CI runs) leaves torch out: seconds for a smoke run.
            imports = _import_costs(args.repeats, with_torch=not args.quick)
        finally:
            moto.stop()
    summary = {case: _summary(bench.runs.get(case, [])) for case in (*CASES, "priming")}
    targets = [
        report.Target(
            f"{case}_ttfr",
            f"demo model, {what} warm worker, node-cache hit: time to first response <= 300 ms",
            summary[case]["ttfr_s"],
            TARGET_WARM_HIT_S,
            is_max=True,
        )
        for case, what in ((WARM_HIT, "a used"), (WARM_FRESH, "a never-used"))
        if bench.runs.get(case)
    ]
    if bench.runs.get(COLD_LOCAL):
        targets.insert(
            0,
            report.Target(
                f"{COLD_LOCAL}_ttfr",
                "demo model in a local folder, no worker (forked from the template): time "
                "to first response <= 300 ms",
                summary[COLD_LOCAL]["ttfr_s"],
                TARGET_COLD_LOCAL_S,
                is_max=True,
            ),
        )
    print(_table(summary))
    print(_imports_table(imports))
    print(report.targets_text(targets))
    document: dict[str, Any] = {
        "benchmark": "scale_from_zero",
        "started_utc": started_utc.isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - started, 1),
        "argv": sys.argv,
        "machine": machine.describe(REPO_ROOT, load_generator="http.client, one request"),
        "settings": {
            "model": DEMO_MODEL,
            "model_widths": list(_SPEC.widths),
            "request": "batch 1, binary tensors, fresh connection to the activator",
            "storage": "moto_server on loopback (s3://models/...), or a local folder",
            "repeats": args.repeats,
            "settle_s": args.settle,
            "order": "cold runs on two platforms without warm workers, up together, one "
            "forking workers from its template and one spawning them (worker_template off), "
            "taking turns in the other order each repeat, each running a local-folder then an "
            "S3 start; warm_hit_fresh on a new platform each (one warm worker); then "
            "warm_miss, warm_hit, warm_local in turn on one platform with one warm worker "
            "(max_workers 1 everywhere)",
            "reset": "POST /admin/v1/models/{name}/unload; cold: also wait for the worker "
            "process to exit",
            "fast_reset_env": FAST_RESET_ENV,
            "commands": bench.commands,
        },
        "summary": summary,
        "imports": imports,
        "templates": bench.templates,
        "runs": bench.runs,
        "targets": [asdict(t) | {"passed": t.passed} for t in targets],
    }
    if not args.no_save:
        path = RESULTS_DIR / f"{stamp}-{tag}-scale_from_zero.json"
        report.write_json(path, document)
        print(f"\nresults: {path.relative_to(REPO_ROOT)} ({document['wall_s']:.0f} s)")
    return 0


def _upload(s3: Any, model_dir: Path, prefix: str) -> str:
    """Put the model folder under ``prefix``; its storage URI."""
    for path in sorted(model_dir.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{DEMO_MODEL}/{path.relative_to(model_dir).as_posix()}"
            s3.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
    return f"s3://{BUCKET}/{prefix}/{DEMO_MODEL}"


def _cold_phase(bench: _Bench, repeats: int) -> None:
    """No warm worker: every run starts a worker process, forked on one platform and
    spawned on the other (the cache holds the model)."""
    with (
        bench.platform("platform-cold", warm_workers=0) as forking,
        bench.platform("platform-cold-spawn", warm_workers=0, env=TEMPLATE_OFF_ENV) as spawning,
    ):
        for platform in (forking, spawning):
            platform.register(DEMO_MODEL, _BASE_URI, {"min_replicas": 0, "max_replicas": 1})
            _timed(bench, platform, "priming")
        turns = ((forking, COLD_LOCAL, COLD), (spawning, COLD_LOCAL_SPAWN, COLD_SPAWN))
        for repeat in range(repeats):
            for platform, local_case, s3_case in turns if repeat % 2 == 0 else turns[::-1]:
                for case, storage_uri in ((local_case, str(bench.local_dir)), (s3_case, _BASE_URI)):
                    _to_zero(platform, warm_workers=0)
                    _set_storage(platform, storage_uri)
                    _settle(bench)
                    _timed(bench, platform, case)
                    _progress(bench, case, repeat, repeats)
        for name, platform in (("platform-cold", forking), ("platform-cold-spawn", spawning)):
            template = _template_pid(platform)
            bench.templates[name] = (
                {"pid": template, "cpu_s": process_cpu_seconds(template)}
                if template is not None
                else None
            )


def _fresh_phase(bench: _Bench, repeats: int) -> None:
    """A new platform per run, whose one warm worker has never loaded a model."""
    for repeat in range(repeats):
        with bench.platform("platform-fresh", warm_workers=1) as platform:
            _wait_warm(platform)
            platform.register(DEMO_MODEL, _BASE_URI, {"min_replicas": 0, "max_replicas": 1})
            _settle(bench)
            _timed(bench, platform, WARM_FRESH)
            _progress(bench, WARM_FRESH, repeat, repeats)


def _warm_phase(bench: _Bench, repeats: int) -> None:
    """One warm worker, used before: each repeat runs a miss, a hit and a local-folder start."""
    s3 = bench.moto.client()
    with bench.platform("platform-warm", warm_workers=1) as platform:
        _wait_warm(platform)
        platform.register(DEMO_MODEL, _BASE_URI, {"min_replicas": 0, "max_replicas": 1})
        platform.load(DEMO_MODEL)  # untimed: the worker's first load (see warm_hit_fresh)
        bench.seen_workers.update(str(w["id"]) for w in platform.workers())
        for repeat in range(repeats):
            fresh = _upload(s3, bench.local_dir, f"miss-{repeat}")
            for case, storage_uri in (
                (WARM_MISS, fresh),
                (WARM_HIT, fresh),
                (WARM_LOCAL, str(bench.local_dir)),
            ):
                # At zero first: a storage change to a loaded model reloads it in place in
                # the background, and an unload racing that reload can be undone by it.
                _to_zero(platform, warm_workers=1)
                _set_storage(platform, storage_uri)
                _settle(bench)
                _timed(bench, platform, case)
                _progress(bench, case, repeat, repeats)


def _template_pid(platform: PlatformProcess) -> int | None:
    """The platform's worker template: its child running ``python -m data_plane.template``."""
    for pid in children_by_parent().get(platform.pid, ()):
        try:
            if _TEMPLATE_MODULE in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def _worker_processes(platform: PlatformProcess) -> set[int]:
    """The platform's live worker processes, starting ones included (the admin API lists a
    worker only once it answers): its children but the template, and the template's."""
    template = _template_pid(platform)
    pids = platform.worker_pids() - {template}
    if template is not None:
        pids |= {p for p in children_by_parent().get(template, ()) if is_alive(p)}
    return pids


_IMPORTS: Final = {
    "interpreter": "pass",
    "data_plane": "import data_plane.server",
    "template_preload": "from data_plane.template.preload import preload; preload()",
    "torch": "import torch",
}
"""What a worker process pays before serving, when it does not come from the template: the
interpreter's start, the data plane's imports, what the template imports (the data plane
and what its start-up imports lazily), and torch (a CUDA pool's workers)."""


def _import_costs(repeats: int, *, with_torch: bool = True) -> dict[str, Any]:
    """Each of `_IMPORTS` in a new interpreter, in turn ``repeats`` times: medians of the
    wall and CPU seconds (the pod side: a pod's container starts this way)."""
    has_torch = with_torch and importlib.util.find_spec("torch") is not None
    kinds = {k: v for k, v in _IMPORTS.items() if k != "torch" or has_torch}
    samples: dict[str, dict[str, list[float]]] = {k: {"wall_s": [], "cpu_s": []} for k in kinds}
    for _ in range(repeats):
        for kind, code in kinds.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, timeout=300)
            wall = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            samples[kind]["wall_s"].append(wall)
            samples[kind]["cpu_s"].append(cpu)
    return {
        kind: {
            "code": kinds[kind],
            **{key: statistics.median(values) for key, values in sample.items()},
            "load_average_1m": os.getloadavg()[0],
        }
        for kind, sample in samples.items()
    }


def _imports_table(imports: dict[str, Any]) -> str:
    lines = ["", "a new interpreter importing what a worker needs (medians), ms:"]
    for kind, row in imports.items():
        lines.append(
            f"  {kind:<18}wall {row['wall_s'] * 1e3:8.1f}  cpu {row['cpu_s'] * 1e3:8.1f}"
            f"   ({row['code']})"
        )
    return "\n".join(lines)


def _wait_warm(platform: PlatformProcess) -> None:
    def one_empty_worker() -> bool:
        workers = platform.workers()
        return len(workers) == 1 and not workers[0]["models"] and workers[0]["state"] == "ready"

    platform.wait_until(one_empty_worker, "the warm worker")


def _set_storage(platform: PlatformProcess, storage_uri: str) -> None:
    current = platform.model(DEMO_MODEL)["storage_uri"]
    if current != storage_uri:
        platform.admin("PATCH", f"/models/{DEMO_MODEL}", {"storage_uri": storage_uri})


def _to_zero(platform: PlatformProcess, *, warm_workers: int) -> None:
    """Unload the model, wait until the pool is back to ``warm_workers`` empty workers and
    every other worker process has exited (a stopping worker would compete for the CPU)."""
    pids: set[int] = set()
    seen: dict[str, Any] = {}

    def workers() -> list[dict[str, Any]]:
        listed = platform.workers()
        pids.update(int(w["details"]["pid"]) for w in listed if "pid" in w["details"])
        seen["workers"] = [(w["id"], w["state"], w["models"]) for w in listed]
        return listed

    workers()
    # The activator reports its traffic once a second: until its report of the last request
    # done has come, an unload leaves the model with a request seemingly in flight and no
    # replica, which the autoscaler's scale-from-zero path loads back at once.
    platform.wait_until(
        lambda: platform.model(DEMO_MODEL)["status"]["in_flight"] == 0,
        f"the activator to report {DEMO_MODEL}'s last request done",
    )
    platform.unload(DEMO_MODEL)

    def at_zero() -> bool:
        seen["model"] = platform.model(DEMO_MODEL)["status"]
        listed = workers()
        empty = [w for w in listed if w["state"] == "ready" and not w["models"]]
        seen["processes"] = _worker_processes(platform)
        return (
            seen["model"]["state"] == "scaled_to_zero"
            and len(listed) == warm_workers
            and len(empty) == warm_workers
            and len(seen["processes"]) == warm_workers
        )

    # The reaper may have decided to start a replacement warm worker while the model was
    # still loaded; give that decision time to show as a process before judging the pool.
    time.sleep(_REAPER_SPAWN_S)
    try:
        platform.wait_until(at_zero, f"{DEMO_MODEL} at zero with {warm_workers} warm worker(s)")
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\nlast seen: {seen}") from None
    kept = {int(w["details"]["pid"]) for w in platform.workers() if "pid" in w["details"]}

    def stopped_ones_gone() -> bool:
        return not any(is_alive(pid) for pid in pids - kept)

    platform.wait_until(stopped_ones_gone, "stopped worker processes to exit")


def _settle(bench: _Bench) -> None:
    """Sleep ``settle_s`` before a timed request, measuring the machine's noise meanwhile."""
    # Our processes are quiet while we settle, so the machine's busy CPU meanwhile is
    # other processes' (noise the timed request may meet).
    busy = machine.busy_cpu_seconds()
    started = time.monotonic()
    time.sleep(bench.settle_s)
    elapsed = time.monotonic() - started
    bench.noise_cores = (machine.busy_cpu_seconds() - busy) / elapsed if elapsed > 0 else 0.0


def _timed(bench: _Bench, platform: PlatformProcess, case: str) -> None:
    """One request at a model with no replica, and its cold-start timeline."""
    load_average = os.getloadavg()[0]
    platform_cpu = platform.cpu_seconds()
    sent_wall = time.time()
    started = time.perf_counter()
    served = infer_once(platform.port, DEMO_MODEL, bench.body)
    ttfr_s = time.perf_counter() - started
    platform_cpu = platform.cpu_seconds() - platform_cpu
    if served.shape != bench.expected.shape or not np.allclose(served, bench.expected, 1e-3, 1e-4):
        raise RuntimeError(f"{case}: the answer differs from ONNX Runtime's")
    timeline = _timeline(platform)
    serving = ((timeline or {}).get("worker") or {}).get("id")
    listed = platform.workers()
    replacements = [
        float(w["started_at"]) - sent_wall
        for w in listed
        if float(w["started_at"]) > sent_wall and w["id"] != serving
    ]
    pid = next((w["details"].get("pid") for w in listed if w["id"] == serving), None)
    # Since its fork or exec: a spawned worker's imports count, a forked one's do not.
    worker_cpu = process_cpu_seconds(pid) if isinstance(pid, int) and is_alive(pid) else None
    if timeline is None or timeline["queued_at"] < sent_wall - 0.05:
        raise RuntimeError(f"{case}: the request caused no activation (was the model at zero?)")
    if timeline["outcome"] not in ("ready", "revived"):
        raise RuntimeError(f"{case}: activation {timeline['outcome']}: {timeline['error']}")
    durations = timeline["durations_s"]
    worker = timeline["worker"] or {}
    queued_s = timeline["queued_at"] - sent_wall
    total_s = float(durations["total"])
    load_s = durations.get("load")
    fetch_s = durations.get("fetch")
    engine_cache, worker_load_s = _worker_log_facts(platform, str(worker.get("id")))
    record = {
        "ttfr_s": ttfr_s,
        "before_activation_s": queued_s,
        "activation_s": total_s,
        "worker_s": durations.get("worker"),
        "worker_boot_s": durations.get("worker_boot"),
        "load_s": load_s,
        "fetch_s": fetch_s,
        "rest_of_load_s": durations.get("engine", load_s),
        "worker_load_s": worker_load_s,
        "after_ready_s": ttfr_s - queued_s - total_s,
        "first_response_s": durations.get("first_response"),
        "cache": timeline["cache"],
        "engine_cache": engine_cache,
        "bytes_fetched": timeline["bytes_fetched"],
        "worker_started": worker.get("started"),
        "start_method": worker.get("start_method"),
        "worker_cpu_s": worker_cpu,
        "platform_cpu_s": platform_cpu,
        "load_average_1m": load_average,
        "worker_reused": worker.get("id") in bench.seen_workers,
        "noise_cores": bench.noise_cores,
        # The reaper keeps --warm-workers empty: once the warm worker takes the model it
        # starts another, whose start-up may overlap this request on a small machine.
        "new_worker_started_after_s": min(replacements) if replacements else None,
        "timeline": timeline,
    }
    bench.seen_workers.add(str(worker.get("id")))
    bench.runs.setdefault(case, []).append(record)


def _timeline(platform: PlatformProcess) -> dict[str, Any] | None:
    """The newest timeline; waits briefly for its ``first_response``, which the activator
    reports after the answer (where the platform records it at all)."""
    deadline = time.monotonic() + _FIRST_RESPONSE_WAIT_S
    while True:
        timelines = platform.activations(DEMO_MODEL)
        timeline = timelines[0] if timelines else None
        if timeline is None or "first_response" in timeline["durations_s"]:
            return timeline
        if time.monotonic() > deadline:
            return timeline
        time.sleep(0.02)


def _worker_log_facts(platform: PlatformProcess, worker_id: str) -> tuple[str | None, float | None]:
    """From the worker's log, its last load: the engine cache (``hit``/``miss``/``off``) and
    the seconds the worker's repository took (fetch or cache check, config, session build)."""
    try:
        text = (platform.worker_log_dir / f"{worker_id}.log").read_text(errors="replace")
    except OSError:
        return None, None
    engine = _ENGINE_LOG.findall(text)
    loaded = _LOADED_LOG.findall(text)
    return (engine[-1] if engine else None), (float(loaded[-1]) if loaded else None)


def _progress(bench: _Bench, case: str, repeat: int, repeats: int) -> None:
    run = bench.runs[case][-1]
    print(
        f"[{repeat + 1}/{repeats}] {case:<15} {run['ttfr_s'] * 1e3:8.1f} ms  "
        f"(activation {run['activation_s'] * 1e3:7.1f} ms, cache {run['cache']}, "
        f"engine cache {run['engine_cache']}, "
        f"{'used' if run['worker_reused'] else 'new'} worker)",
        file=sys.stderr,
        flush=True,
    )


_KEYS: Final = (
    "ttfr_s",
    "before_activation_s",
    "activation_s",
    "worker_s",
    "worker_boot_s",
    "fetch_s",
    "rest_of_load_s",
    "load_s",
    "worker_load_s",
    "after_ready_s",
    "first_response_s",
    "noise_cores",
    "worker_cpu_s",
    "platform_cpu_s",
    "load_average_1m",
)


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    if not runs:
        return {"runs": 0}
    out: dict[str, Any] = {"runs": len(runs)}
    for key in _KEYS:
        values = [float(r[key]) for r in runs if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    ttfr = [float(r["ttfr_s"]) for r in runs]
    out["ttfr_min_s"], out["ttfr_max_s"] = min(ttfr), max(ttfr)
    out["cache"] = sorted({str(r["cache"]) for r in runs})
    out["engine_cache"] = sorted({str(r["engine_cache"]) for r in runs})
    out["worker_started"] = sorted({bool(r["worker_started"]) for r in runs})
    out["start_method"] = sorted({str(r.get("start_method") or "-") for r in runs})
    out["runs_overlapping_a_worker_start"] = sum(
        1
        for r in runs
        if r["new_worker_started_after_s"] is not None
        and r["new_worker_started_after_s"] < r["ttfr_s"]
    )
    return out


def _table(summary: dict[str, Any]) -> str:
    header = (
        f"{'case':<17}{'runs':>5}{'ttfr':>8}{'min':>8}{'max':>8}{'queue':>8}{'worker':>8}"
        f"{'boot':>8}{'load':>8}{'fetch':>8}{'rest':>8}{'in wrk':>8}{'activ.':>8}{'after':>8}"
        f"{'wrk cpu':>8}{'loadavg':>8}  cache / engine cache"
    )
    lines = [
        "",
        f"{DEMO_MODEL} ({_SPEC.description}): time to first response from zero, ms "
        "(medians; queue..after break the ttfr down, from the activation timelines)",
        header,
        "-" * len(header),
    ]
    for case in (*CASES, "priming"):
        s = summary[case]
        if not s["runs"]:
            continue
        load_average = s["load_average_1m"]
        lines.append(
            f"{case:<17}{s['runs']:>5}{_ms(s['ttfr_s'])}{_ms(s['ttfr_min_s'])}"
            f"{_ms(s['ttfr_max_s'])}{_ms(s['before_activation_s'])}{_ms(s['worker_s'])}"
            f"{_ms(s['worker_boot_s'])}{_ms(s['load_s'])}{_ms(s['fetch_s'])}"
            f"{_ms(s['rest_of_load_s'])}{_ms(s['worker_load_s'])}{_ms(s['activation_s'])}"
            f"{_ms(s['after_ready_s'])}{_ms(s['worker_cpu_s'])}"
            f"{(f'{load_average:.2f}' if load_average is not None else '-'):>8}"
            f"  {'/'.join(s['cache'])} / {'/'.join(s['engine_cache'])}"
        )
    noisy = [
        c for c, s in summary.items() if s["runs"] and s["noise_cores"] > report.NOISY_OTHER_CORES
    ]
    if noisy:
        lines += [
            "",
            f"WARNING: other processes kept the machine busy (> {report.NOISY_OTHER_CORES} "
            f"cores, median) before the runs of {', '.join(noisy)}; compare min and max.",
        ]
    lines += [
        "",
        "ttfr: request sent -> answer received (client). queue: request sent -> activation "
        "queued. worker: queued -> worker ready (a process started, or a warm one picked); "
        "boot: of that, the started process existing -> its first liveness answer (a "
        "spawned one imports meanwhile). "
        "load: the control plane's load call (fetch: the node cache's download, misses only; "
        "rest: the remainder, for hits the whole load: storage listing, config, session "
        "build); in wrk: the load as the worker's log times it. activ.: queued -> placement "
        "recorded. after: placement recorded -> answer received (the activator sees the "
        "placement, proxies the buffered request, the worker infers). wrk cpu: CPU the "
        "serving worker had used by its answer, since its fork or exec. loadavg: the "
        "machine's 1-minute load average as the request went. priming: the first (cold, "
        "cache miss) start of each cold platform, not counted.",
    ]
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return f"{value * 1e3:>8.1f}" if value is not None else f"{'-':>8}"


if __name__ == "__main__":
    sys.exit(main())
