"""zeroserve side by side with the engine alone, MLServer, KServe and Triton: one run, one machine.

On the same generated model (the light MLP, 256->1024->1024->1024->10, batch-1 requests) and
the same load (closed loop, JSON, at each concurrency; ``wrk`` where it is installed, else
``zeroserve bench``: ``--client``), it measures:

* the **engine alone**: ONNX Runtime's ``session.run`` in this process at batch 1 and 32,
  with the session options every server below uses (``bench/engine.py``);
* **zeroserve**, the data plane directly (``python -m data_plane``, dynamic batching up to
  32), and **through the activator** (``zeroserve up``, one replica held);
* **MLServer 1.7.1** with adaptive batching (up to 32, ``--mlserver-max-batch-time``) and a
  small custom ONNX Runtime runtime (``bench/peers/mlserver_ort.py``), at
  ``parallel_workers: 0`` (its best setting) and at its default (one worker process);
* **KServe**'s Python model server with a custom ``kserve.Model`` on ONNX Runtime
  (``bench/peers/kserve_ort.py``), access and latency logs off;
* **real Triton 2.51** (the ``nvidia-pytriton`` wheel's binary, installed by
  ``bench/triton_server.py`` into its cache folder; the wheel has only the Python backend) running
  the same ONNX Runtime call in a ``model.py`` (``bench/python_backend.py``'s), and
  **zeroserve serving that call as a Python model** (``bench/comparison/python_models.py``),
  the yardstick of zeroserve's own ONNX path (skipped, saying why, where the wheel or the
  system Python its stub needs cannot be had).

zeroserve, its Python model and Triton are also measured with binary tensors over HTTP/1.1
(the same wrk load) and over gRPC (h2load, where installed; ``--protocols``).

Each peer is installed by this script into its own virtual environment under ``--cache-dir``
(reused by later runs). All servers run at once, idle but for the one under load; each
repeat visits them all in turn (the order reversed on odd repeats), and medians are
reported with each one's ratio to the engine alone at batch 32 and zeroserve's margin over
the best peer. Then each server that can load and unload a model through an API loads a
generated ~1 GB ONNX model, answers one request and unloads it (page cache warm), in turn.

Results: ``bench/results/<UTC time>-<tag>-compare.json`` and ``...-compare.png``.

    python bench/compare.py                  # full run (about 35 minutes on 2 cores)
    python bench/compare.py --quick          # CI smoke run: engine + zeroserve, JSON only
    python bench/compare.py --device cuda    # GPU (untested: no GPU where this was written)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

if __name__ == "__main__" and not __package__:
    # Run as a script, sys.path[0] is bench/, where bench/grpc.py would shadow the grpc
    # package: the repository root takes its place (and makes `bench` a package).
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np

from bench import engine as engine_module, h2load, machine, models, report
from bench.comparison import cold_load, gpu, measure, results
from bench.comparison.contenders import (
    Contender,
    Kserve,
    Mlserver,
    ZeroserveActivator,
    ZeroserveDirect,
    link_model,
)
from bench.comparison.grpc_probe import GrpcProbe
from bench.comparison.python_models import TritonPeer, ZeroservePython
from bench.comparison.variants import PROTOCOLS, Variant, variant_key, variants
from bench.comparison.venvs import PeerEnv, ensure_envs, peer_packages
from bench.loadgen import Target, WrkLoad
from bench.server import REPO_ROOT, infer_once, request
from bench.triton_server import triton_install

RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
SERVED_MODEL: Final = models.MODELS["light"]
BIG_WIDTH: Final = 8192
"""Four 8192x8192 FP32 layers: 1.07 GB of weights."""
QUICK_BIG_WIDTH: Final = 2048
"""Four 2048x2048 layers: 67 MB, enough to exercise the load path in a smoke run."""
ALL_PEERS: Final = ("mlserver", "mlserver-default", "kserve", "triton", "zeroserve-python")
CAVEAT: Final = (
    "Measured on a shared 2-core machine where other work runs at the same time: HTTP "
    "figures drift 15-25% between rounds. Servers are alternated within the run and medians "
    "reported; 'other' CPU records the noise beside each point."
)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke run (see --peers)")
    parser.add_argument("--repeats", type=int, default=3, help="passes over all servers")
    parser.add_argument("--duration", type=float, default=10.0, help="timed seconds per point")
    parser.add_argument("--warmup", type=float, default=2.0, help="untimed seconds per point")
    parser.add_argument("--concurrency", default="1,8,32,64", help="closed-loop connections")
    parser.add_argument("--engine-batches", default="1,32", help="engine-alone batch sizes")
    parser.add_argument(
        "--peers",
        default=None,
        help=f"comma-separated subset of {','.join(ALL_PEERS)}, or 'none' "
        "(default: all; with --quick: none, since installing them takes minutes)",
    )
    parser.add_argument(
        "--protocols",
        default=None,
        help=f"comma-separated subset of {','.join(PROTOCOLS)} for the servers that speak "
        "them (default: all; with --quick: json)",
    )
    parser.add_argument("--no-activator", action="store_true", help="skip zeroserve up")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path.home() / ".cache" / "zeroserve-bench",
        help="peers' virtual environments and the generated large model",
    )
    parser.add_argument("--cold-repeats", type=int, default=3, help="0 skips the cold loads")
    parser.add_argument(
        "--mlserver-max-batch-time",
        type=float,
        default=0.001,
        help="MLServer max_batch_time, seconds (must be > 0 for adaptive batching)",
    )
    parser.add_argument(
        "--client",
        choices=["auto", "wrk", "zeroserve-bench"],
        default="auto",
        help="load generator for every server: wrk (one thread, one pre-built JSON body; "
        "auto picks it where it is installed) or zeroserve bench (random inputs per request, "
        "several times wrk's CPU per request)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no files")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--replot",
        type=Path,
        metavar="RESULTS.json",
        help="measure nothing: print the tables of a saved run and redraw its PNG",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.repeats, args.cold_repeats = 1.0, 0.5, 1, 1
        args.concurrency = "1,64"
    if args.peers is None:
        args.peers = "none" if args.quick else ",".join(ALL_PEERS)
    args.peer_list = [] if args.peers == "none" else _names(args.peers)
    if args.protocols is None:
        args.protocols = "json" if args.quick else ",".join(PROTOCOLS)
    args.protocol_list = _names(args.protocols)
    if "json" not in args.protocol_list or set(args.protocol_list) - set(PROTOCOLS):
        parser.error(f"--protocols: a subset of {PROTOCOLS} that includes json")
    unknown = set(args.peer_list) - set(ALL_PEERS)
    if unknown:
        parser.error(f"unknown peers {sorted(unknown)}; choose from {ALL_PEERS}")
    if args.client == "auto":
        args.client = "wrk" if WrkLoad.is_available() else "zeroserve-bench"
    elif args.client == "wrk" and not WrkLoad.is_available():
        parser.error("--client wrk: wrk not found (apt-get install -y wrk)")
    args.concurrency_list = [int(x) for x in _names(args.concurrency)]
    args.batch_list = [int(x) for x in _names(args.engine_batches)]
    if results.REFERENCE_BATCH not in args.batch_list:
        args.batch_list.append(results.REFERENCE_BATCH)
    if args.duration <= 0 or args.warmup < 0 or args.repeats < 1 or args.cold_repeats < 0:
        parser.error("--duration > 0, --warmup >= 0, --repeats >= 1, --cold-repeats >= 0")
    return args


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


@dataclass
class _Setup:
    """What the run measures with: models, contenders and the engine alone."""

    workdir: Path
    repository: Path
    big_name: str
    big_path: Path
    big_spec: models.MlpSpec
    contenders: list[Contender]
    engine: Any
    skipped: dict[str, str]
    peer_envs: dict[str, PeerEnv]
    gpu_info: gpu.GpuInfo | None
    variants: list[Variant]
    grpc: dict[str, GrpcProbe]
    """By contender key: its gRPC endpoint, for those measured over gRPC."""
    protocols: list[str]
    """What is measured: JSON, and binary and gRPC where their clients can run."""


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.replot is not None:
        return _replot(args.replot)
    started = time.monotonic()
    started_utc = datetime.now(UTC)
    stamp = started_utc.strftime("%Y-%m-%dT%H%M%SZ")
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", args.tag or socket.gethostname()).strip("-") or "host"
    gpu_info = None
    if args.device == "cuda":
        try:
            gpu_info = gpu.require_cuda()
        except gpu.NoCudaError as exc:
            print(f"compare: --device cuda: {exc}", file=sys.stderr)
            return 2
        tag = f"{tag}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', gpu_info.name)}"
    if args.quick and not args.peer_list:
        print(
            "compare --quick: MLServer and KServe are skipped: installing them into their "
            "virtual environments takes about 2 minutes here, more than a smoke run may "
            "spend; so is real Triton (the first run downloads its wheel, and its stub, "
            "ONNX Runtime import and server start add seconds to a run meant to take few), "
            "and zeroserve's Python-model form. Run without --quick (or with --peers) to "
            "include them.",
            file=sys.stderr,
            flush=True,
        )
    with (
        tempfile.TemporaryDirectory(prefix="zeroserve-compare-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        setup = _set_up(args, Path(tmp), gpu_info)
        for contender in setup.contenders:
            stack.callback(contender.stop)
        setup.contenders = _start_all(setup.contenders, setup.skipped)
        _open_grpc(args, setup, stack)
        _verify(setup)
        entries = _measure(args, setup)
        gpu_extra = _gpu_extras(args, setup) if setup.gpu_info is not None else None
        cold = _cold_loads(args, setup) if args.cold_repeats else {}
        commands = {c.key: c.command for c in setup.contenders}
    titles = {c.key: c.title for c in setup.contenders}
    titles |= {v.key: v.title for v in setup.variants}
    document = _document(args, setup, entries, cold, commands, titles, started, started_utc)
    document["gpu_extras"] = gpu_extra
    print()
    print(results.text_table(entries, args.concurrency_list, args.repeats, args.client))
    summary = document["summary"]
    for line in results.native_onnx_lines(summary.get("native_onnx", {})):
        print(line)
    for c, margin in summary["zeroserve_vs_best_peer"].items():
        print(
            f"c={c}: zeroserve {margin['throughput_ratio']:.2f}x the best peer "
            f"({margin['best_peer']}); p99 {margin['zeroserve_p99_ms']:.1f} ms vs "
            f"{margin['best_peer_p99_ms']:.1f} ms"
        )
    if cold:
        print()
        print(
            f"cold load of {setup.big_spec.parameter_count * 4 / 1e9:.2f} GB "
            f"({setup.big_spec.description}), medians of {args.cold_repeats}:"
        )
        print(results.cold_load_table(cold, titles))
    for key, why in setup.skipped.items():
        print(f"skipped {key}: {why.splitlines()[0][:300]}")
    print()
    print(results.markdown_table(entries, args.concurrency_list, titles))
    print(f"\n{CAVEAT}")
    if not args.no_save:
        suffix = "-quick" if args.quick else ""
        base = args.results_dir / f"{stamp}-{tag}-compare{suffix}"
        report.write_json(base.with_suffix(".json"), document)
        _plot(base.with_suffix(".png"), entries, document)
        print(f"\nresults: {base.with_suffix('.json')} and .png ({document['wall_s']:.0f} s)")
    return 0


# -- set-up --------------------------------------------------------------------------------


def _set_up(args: argparse.Namespace, workdir: Path, gpu_info: gpu.GpuInfo | None) -> _Setup:
    repository = workdir / "models"
    models.write_repository(repository, [SERVED_MODEL], max_queue_delay_us=0)
    width = QUICK_BIG_WIDTH if args.quick else BIG_WIDTH
    big_spec = models.MlpSpec("big", (width,) * 5)
    big_path = _cached_model(args.cache_dir, big_spec)
    link_model(big_path, repository / "big" / "1" / "model.onnx")
    config = models.config_text(big_spec, max_queue_delay_us=0)
    light_config = models.config_text(SERVED_MODEL, max_queue_delay_us=0)
    if args.device == "cuda":
        config = config.replace("KIND_CPU", "KIND_GPU")
        light_config = light_config.replace("KIND_CPU", "KIND_GPU")
    (repository / "big" / "config.pbtxt").write_text(config, encoding="utf-8")
    (repository / SERVED_MODEL.name / "config.pbtxt").write_text(light_config, encoding="utf-8")
    light_path = repository / SERVED_MODEL.name / "1" / "model.onnx"
    onnx_files = {SERVED_MODEL.name: light_path, "big": big_path}
    skipped: dict[str, str] = {}
    envs: dict[str, PeerEnv] = {}
    wanted = {name for name in args.peer_list}
    packages = peer_packages(args.device)
    needed = {p: packages[p] for p in ("mlserver", "kserve") if _uses(p, wanted)}
    if needed:
        print(f"peers: preparing {', '.join(needed)} under {args.cache_dir}", flush=True)
        envs, failures = ensure_envs(args.cache_dir, needed)
        for name, env in envs.items():
            how = f"installed in {env.install_s:.0f} s" if env.install_s else "reused"
            print(f"peers: {name} {how} ({' '.join(env.packages)})", flush=True)
        for name, why in failures.items():
            for key in wanted:
                if _uses(name, {key}):
                    skipped[key] = f"environment: {why}"
    peer_env = {
        "ZEROSERVE_PEER_INTRA_OP_THREADS": str(engine_module.INTRA_OP_THREADS),
        "ZEROSERVE_PEER_INTER_OP_THREADS": str(engine_module.INTER_OP_THREADS),
        "ZEROSERVE_PEER_DEVICE": args.device,
    }
    initial = [SERVED_MODEL.name]
    contenders: list[Contender] = [ZeroserveDirect(workdir, repository, initial)]
    if not args.no_activator:
        contenders.append(ZeroserveActivator(workdir, repository, initial))
    metadata = {
        name: _metadata(spec) for name, spec in (("light", SERVED_MODEL), ("big", big_spec))
    }
    for key, workers in (("mlserver", 0), ("mlserver-default", None)):
        if key in wanted and "mlserver" in envs:
            contenders.append(
                Mlserver(
                    workdir,
                    envs["mlserver"].python,
                    onnx_files,
                    metadata,
                    initial,
                    parallel_workers=workers,
                    max_batch_size=models.MAX_BATCH_SIZE,
                    max_batch_time_s=args.mlserver_max_batch_time,
                    env=peer_env,
                )
            )
    if "kserve" in wanted and "kserve" in envs:
        contenders.append(Kserve(workdir, envs["kserve"].python, onnx_files, initial, env=peer_env))
    python_models = {SERVED_MODEL.name: (SERVED_MODEL, light_path), "big": (big_spec, big_path)}
    if "zeroserve-python" in wanted:
        contenders.append(ZeroservePython(workdir, python_models, initial))
    if "triton" in wanted:
        if args.device == "cuda":
            skipped["triton"] = "the Python-backend model.py runs ONNX Runtime on the CPU only"
        else:
            install = triton_install()
            if isinstance(install, str):
                skipped["triton"] = f"real Triton cannot run here: {install}"
                print(f"triton: skipped: {install}", file=sys.stderr, flush=True)
            else:
                contenders.append(TritonPeer(workdir, install, python_models, initial))
    if args.device == "cuda":
        assert gpu_info is not None
        engine: Any = gpu.CudaEngine(light_path, gpu_info, models.INPUT_NAME, models.OUTPUT_NAME)
    else:
        engine = engine_module.Engine(light_path)
    return _Setup(
        workdir,
        repository,
        "big",
        big_path,
        big_spec,
        contenders,
        engine,
        skipped,
        envs,
        gpu_info,
        [],
        {},
        ["json"],
    )


def _uses(environment: str, wanted: set[str]) -> bool:
    return any(key.split("-")[0] == environment for key in wanted)


def _metadata(spec: models.MlpSpec) -> dict[str, list[dict[str, object]]]:
    return {
        "inputs": [{"name": models.INPUT_NAME, "datatype": "FP32", "shape": [-1, spec.input_size]}],
        "outputs": [
            {"name": models.OUTPUT_NAME, "datatype": "FP32", "shape": [-1, spec.output_size]}
        ],
    }


def _cached_model(cache_dir: Path, spec: models.MlpSpec) -> Path:
    """The generated large model, kept in the cache folder (writing 1 GB takes a while)."""
    path = cache_dir / "models" / f"mlp-{'x'.join(str(w) for w in spec.widths)}.onnx"
    if not path.is_file():
        print(
            f"generating {spec.description} ({spec.parameter_count * 4 / 1e9:.2f} GB)", flush=True
        )
        partial = path.with_suffix(".partial")
        models.write_model(spec, partial)
        partial.replace(path)
    return path


def _start_all(contenders: list[Contender], skipped: dict[str, str]) -> list[Contender]:
    """Start each contender; one that fails is reported and left out, the rest go on."""
    running = []
    for contender in contenders:
        started = time.monotonic()
        try:
            contender.start()
        except Exception as exc:
            skipped[contender.key] = f"did not start: {exc}"
            print(f"{contender.key}: did not start: {str(exc)[:2000]}", file=sys.stderr)
            continue
        print(f"{contender.key}: ready in {time.monotonic() - started:.1f} s", flush=True)
        running.append(contender)
    return running


def _verify(setup: _Setup) -> None:
    """Every server must answer the engine's output before anything is timed."""
    row = models.sample_rows(SERVED_MODEL, 1)
    expected = setup.engine.run(row)
    body = models.request_body(SERVED_MODEL, row, "json")
    for contender in list(setup.contenders):
        try:
            served = _served_output(_infer_target(contender).port, body)
        except Exception as exc:
            served = None
            why = f"check request failed: {exc}"
        else:
            why = "its answer differs from the engine's"
        if served is None or not np.allclose(served, expected, rtol=1e-3, atol=1e-4):
            setup.skipped[contender.key] = why
            print(f"{contender.key}: {why}; left out", file=sys.stderr)
            contender.stop()
            setup.contenders.remove(contender)
    setup.variants = variants(setup.contenders, setup.protocols)
    for variant in list(setup.variants):
        if variant.protocol == "json":
            continue
        try:
            if variant.protocol == "grpc":
                served = setup.grpc[variant.contender.key].infer()
            else:
                binary = models.request_body(SERVED_MODEL, row, "binary")
                port = _infer_target(variant.contender).port
                served = infer_once(port, SERVED_MODEL.name, binary)
        except Exception as exc:
            served, why = None, f"check request failed: {exc}"
        else:
            why = "its answer differs from the engine's"
        if served is None or not np.allclose(served, expected, rtol=1e-3, atol=1e-4):
            setup.skipped[variant.key] = why
            print(f"{variant.key}: {why}; left out", file=sys.stderr)
            setup.variants.remove(variant)
    names = ", ".join(v.key for v in setup.variants)
    print(f"verified: {names} answer the engine's output", flush=True)


def _open_grpc(args: argparse.Namespace, setup: _Setup, stack: contextlib.ExitStack) -> None:
    """gRPC probes for the contenders measured over gRPC (h2load needed: else said why)."""
    protocols = [p for p in args.protocol_list if args.client == "wrk" or p == "json"]
    if len(protocols) < len(args.protocol_list):
        setup.skipped["binary/grpc"] = "measured only with --client wrk (and h2load)"
    if "grpc" in protocols and h2load.find() is None:
        protocols.remove("grpc")
        setup.skipped["grpc"] = "h2load not installed (apt-get install -y nghttp2-client)"
    setup.protocols = protocols
    if "grpc" not in protocols:
        return
    row = models.sample_rows(SERVED_MODEL, 1)
    for contender in setup.contenders:
        address = contender.grpc_address if "grpc" in contender.protocols else None
        if address is not None:
            body_file = setup.workdir / f"{contender.key}.grpc"
            probe = GrpcProbe(address, SERVED_MODEL.name, row, body_file)
            stack.callback(probe.close)
            setup.grpc[contender.key] = probe


def _served_output(port: int, body: models.RequestBody) -> np.ndarray:
    """``OUTPUT0`` of a JSON infer answer (peers send ``"parameters": null``, which
    ``bench.server.infer_once`` does not take)."""
    status, _, payload = request(
        port,
        "POST",
        f"/v2/models/{SERVED_MODEL.name}/infer",
        body=body.body,
        headers={"Content-Type": body.content_type},
    )
    if status != 200:
        raise RuntimeError(f"answered {status}: {payload[:300]!r}")
    outputs = json.loads(payload)["outputs"]
    output = next(o for o in outputs if o["name"] == models.OUTPUT_NAME)
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


# -- measuring -------------------------------------------------------------------------------


def _measure(args: argparse.Namespace, setup: _Setup) -> list[results.Entry]:
    settings = measure.LoadSettings(args.duration, args.warmup)
    entries = [
        results.Entry(results.ENGINE, "engine alone", b) for b in sorted(set(args.batch_list))
    ]
    for variant in setup.variants:
        entries += [results.Entry(variant.key, variant.title, c) for c in args.concurrency_list]
    rows = models.sample_rows(SERVED_MODEL, max(args.batch_list))
    per_point = args.duration + args.warmup + 1.0
    print(
        f"{len(entries)} points x {args.repeats} repeats x ~{per_point:.0f} s = "
        f"~{len(entries) * args.repeats * per_point / 60:.1f} min; load: "
        f"{results.LOADS[args.client]}",
        flush=True,
    )
    groups = [results.ENGINE, *(v.key for v in setup.variants)]
    by_key = {v.key: v for v in setup.variants}
    wrk = (
        WrkLoad(setup.workdir, timeout_s=int(settings.timeout_s)) if args.client == "wrk" else None
    )
    bodies = {e: models.request_body(SERVED_MODEL, rows[:1], e) for e in ("json", "binary")}
    h2load_path = h2load.find()
    for repeat in range(args.repeats):
        order = groups if repeat % 2 == 0 else groups[::-1]
        for key in order:
            points = [e for e in entries if e.key == key]
            points = points if repeat % 2 == 0 else points[::-1]
            for entry in points:
                if entry.is_engine:
                    record = measure.engine_point(setup.engine, rows[: entry.size], settings)
                elif by_key[key].protocol == "grpc":
                    assert h2load_path is not None
                    probe = setup.grpc[by_key[key].contender.key]
                    record = measure.grpc_point(
                        h2load_path,
                        probe.url,
                        probe.body_file,
                        entry.size,
                        settings,
                        by_key[key].contender.pid,
                        probe.successes,
                    )
                elif wrk is not None:
                    record = measure.wrk_point(
                        wrk,
                        _infer_target(by_key[key].contender),
                        bodies[by_key[key].protocol],
                        entry.size,
                        settings,
                        by_key[key].contender.pid,
                    )
                else:
                    contender = by_key[key].contender
                    record = measure.served_point(
                        contender.url, SERVED_MODEL.name, entry.size, settings, contender.pid
                    )
                entry.repeats.append(record)
                level = f"b={entry.size}" if entry.is_engine else f"c={entry.size}"
                status = f"  FAILED: {record['failed'][:200]}" if record.get("failed") else ""
                print(
                    f"[{repeat + 1}/{args.repeats}] {key:<20} {level:<6} "
                    f"{record['throughput']:9,.0f}/s  p50 {record.get('p50_ms', 0) or 0:7.2f} ms  "
                    f"p99 {record.get('p99_ms', 0) or 0:7.2f} ms{status}",
                    file=sys.stderr,
                    flush=True,
                )
    return entries


def _infer_target(contender: Contender) -> Target:
    host, port = contender.url.removeprefix("http://").rsplit(":", 1)
    return Target(host, int(port), f"/v2/models/{SERVED_MODEL.name}/infer")


def _gpu_extras(args: argparse.Namespace, setup: _Setup) -> dict[str, Any]:
    """On a GPU: the host-to-device copy rate and PyTorch alone at batch 32 (UNTESTED)."""
    assert setup.gpu_info is not None
    index = setup.gpu_info.index
    extras: dict[str, Any] = {"host_to_device_gb_per_s": None, "torch_engine_alone": None}
    try:
        extras["host_to_device_gb_per_s"] = gpu.host_to_device_gb_per_s(index)
        torch_result = gpu.torch_engine_alone(
            SERVED_MODEL.widths,
            results.REFERENCE_BATCH,
            duration_s=args.duration,
            warmup_s=args.warmup,
            index=index,
        )
        extras["torch_engine_alone"] = asdict(torch_result)
    except gpu.NoCudaError as exc:
        extras["skipped"] = str(exc)
    return extras


def _cold_loads(args: argparse.Namespace, setup: _Setup) -> dict[str, list[dict[str, Any]]]:
    spec = setup.big_spec
    model_bytes = setup.big_path.stat().st_size
    warm_s = cold_load.warm_page_cache(setup.big_path)
    print(
        f"cold loads: {model_bytes / 1e9:.2f} GB model, page cache warmed in {warm_s:.1f} s",
        flush=True,
    )
    row = models.sample_rows(spec, 1)
    body = models.request_body(spec, row, "json")
    probe = gpu.memory_probe(setup.gpu_info.index) if setup.gpu_info is not None else None
    records: dict[str, list[dict[str, Any]]] = {results.ENGINE: []}
    records |= {c.key: [] for c in setup.contenders}
    keys = list(records)
    by_key = {c.key: c for c in setup.contenders}
    for repeat in range(args.cold_repeats):
        for key in keys if repeat % 2 == 0 else keys[::-1]:
            record: dict[str, Any]
            if key == results.ENGINE:
                if setup.gpu_info is not None:
                    record = {"failed": "engine-alone cold load on CUDA is not implemented"}
                else:
                    record = cold_load.engine_cold_load(setup.big_path, row, model_bytes, probe)
            else:
                record = cold_load.served_cold_load(
                    by_key[key], setup.big_name, body, model_bytes, probe
                )
            record["repeat"] = repeat
            records[key].append(record)
            text = record.get("failed") or (
                f"load {record['load_s']:.2f} s + first answer {record['first_infer_s']:.3f} s "
                f"= {record['gb_per_s']:.2f} GB/s"
            )
            print(f"[cold {repeat + 1}/{args.cold_repeats}] {key:<20} {text}", file=sys.stderr)
    return records


# -- results -------------------------------------------------------------------------------

_CONTENDER_LABELS: Final = {
    "zeroserve": "zeroserve (direct)",
    "zeroserve-activator": "zeroserve (activator)",
    "mlserver": "MLServer, parallel_workers=0",
    "mlserver-default": "MLServer, default workers",
    "kserve": "KServe",
    "triton": "Triton 2.51 (model.py)",
    "zeroserve-python": "zeroserve (model.py)",
}
PLOT_LABELS: Final = {
    variant_key(key, protocol): label if protocol == "json" else f"{label}, {protocol}"
    for key, label in _CONTENDER_LABELS.items()
    for protocol in PROTOCOLS
}


def _plot(path: Path, entries: list[results.Entry], document: dict[str, Any]) -> None:
    settings = document["settings"]
    stamp = document["started_utc"]
    results.plot(
        path,
        entries,
        settings["concurrency"],
        PLOT_LABELS,
        title=f"{settings['model']} MLP ({'->'.join(str(w) for w in settings['model_widths'])}),"
        f" batch-1 JSON, {document['device']}, closed loop c="
        f"{','.join(str(c) for c in settings['concurrency'])}, medians of {settings['repeats']}",
        note=f"{stamp}: shared 2-core machine, noisy; medians of alternating repeats "
        "(bench/compare.py)",
    )


def _replot(path: Path) -> int:
    """Print the tables of a saved run and redraw its plot next to it."""
    document = json.loads(path.read_text(encoding="utf-8"))
    entries = [
        results.Entry(
            p["server"],
            p["server"],
            p["batch_size"] if p["kind"] == "engine" else p["concurrency"],
            p["repeats"],
        )
        for p in document["points"]
    ]
    titles = {key: value["title"] for key, value in document["contenders"].items()}
    titles |= {key: value["title"] for key, value in document.get("variants", {}).items()}
    settings = document["settings"]
    # Runs saved before --client existed were all driven by zeroserve bench.
    client = document.get("client", "zeroserve-bench")
    print(results.text_table(entries, settings["concurrency"], settings["repeats"], client))
    for line in results.native_onnx_lines(results.native_onnx(entries, settings["concurrency"])):
        print(line)
    if document.get("cold_load"):
        print()
        print(results.cold_load_table(document["cold_load"], titles))
    print()
    print(results.markdown_table(entries, settings["concurrency"], titles))
    _plot(path.with_suffix(".png"), entries, document)
    print(f"plot: {path.with_suffix('.png')}")
    return 0


def _document(
    args: argparse.Namespace,
    setup: _Setup,
    entries: list[results.Entry],
    cold: dict[str, list[dict[str, Any]]],
    commands: dict[str, list[str]],
    titles: dict[str, str],
    started: float,
    started_utc: datetime,
) -> dict[str, Any]:
    load_example: list[str] | str
    if args.client == "wrk":
        load_example = (
            f"wrk -t1 -c<concurrency> -d<seconds>s -s <script posting one JSON body> "
            f"http://<server>/v2/models/{SERVED_MODEL.name}/infer (an untimed run of "
            f"{args.warmup:g} s first)"
        )
        request_text = "batch 1, JSON (MLServer has no binary tensor extension), one random input"
    else:
        load_example = measure.bench_command(
            "<server url>",
            SERVED_MODEL.name,
            max(args.concurrency_list),
            measure.LoadSettings(args.duration, args.warmup),
            Path("<out.json>"),
        )
        request_text = "batch 1, JSON (MLServer has no binary tensor extension), random inputs"
    others = [r.get("other_cpu_cores") for e in entries for r in e.repeats]
    noise = [float(v) for v in others if v is not None]
    return {
        "benchmark": "compare",
        "started_utc": started_utc.isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - started, 1),
        "argv": sys.argv,
        "quick": args.quick,
        "device": args.device,
        "gpu": setup.gpu_info.__dict__ if setup.gpu_info is not None else None,
        "caveat": CAVEAT,
        "mean_other_cpu_cores": statistics.mean(noise) if noise else None,
        "machine": machine.describe(REPO_ROOT, load_generator=args.client),
        "client": args.client,
        "settings": {
            "model": SERVED_MODEL.name,
            "model_widths": list(SERVED_MODEL.widths),
            "request": request_text,
            "protocols": setup.protocols,
            "grpc_load": f"h2load -t1, -c/-m making the concurrency with up to "
            f"{measure.GRPC_STREAMS_PER_CONNECTION} streams per connection, one framed "
            "batch-1 ModelInferRequest; the server's ModelStatistics success count must "
            "cover h2load's answers",
            "python_model": "bench/python_backend.py's model.py: one InferenceSession with "
            "ONNX Runtime's default options (a spinning pool), a batch's rows run together",
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "repeats": args.repeats,
            "concurrency": args.concurrency_list,
            "engine_batches": sorted(set(args.batch_list)),
            "order": "each repeat visits every server (engine alone included), reversed on "
            "odd repeats; within a server, concurrencies ascending, reversed on odd repeats",
            "load_generator": load_example,
            "ort_session": {
                "providers": "CPUExecutionProvider" if args.device == "cpu" else "CUDA",
                "intra_op_num_threads": engine_module.INTRA_OP_THREADS,
                "inter_op_num_threads": engine_module.INTER_OP_THREADS,
                "threads": "runtimes.onnx.threads.choose_threads (all ONNX servers): one "
                "intra-op thread and no spinning under 32 MiB of weights, else a spinning pool "
                "of the cores per instance; zeroserve also opens a small batching model on a "
                "spinning pool of every core for batches of at most a quarter of "
                "max_batch_size (runtimes.onnx.threads.latency_threads)",
            },
            "zeroserve_batching": models.config_text(SERVED_MODEL, max_queue_delay_us=0),
            "mlserver_batching": {
                "max_batch_size": models.MAX_BATCH_SIZE,
                "max_batch_time_s": args.mlserver_max_batch_time,
            },
            "cold_load": {
                "model": list(setup.big_spec.widths),
                "bytes": setup.big_path.stat().st_size,
                "repeats": args.cold_repeats,
                "page_cache": "warm (read once before the first load)",
                "what": "load API call until ready, plus one batch-1 JSON inference; then unload",
            },
        },
        "peers": {
            name: {"packages": list(env.packages), "install_s": env.install_s}
            for name, env in setup.peer_envs.items()
        },
        "skipped": setup.skipped,
        "contenders": {key: {"title": titles[key], "command": commands[key]} for key in commands},
        "variants": {v.key: {"title": v.title, "protocol": v.protocol} for v in setup.variants},
        "points": [
            {
                "server": e.key,
                "kind": "engine" if e.is_engine else "served",
                "batch_size": e.size if e.is_engine else 1,
                "concurrency": None if e.is_engine else e.size,
                "median": {
                    k: e.median(k)
                    for k in (
                        "throughput",
                        "p50_ms",
                        "p90_ms",
                        "p99_ms",
                        "server_cpu_cores",
                        "server_cpu_ms_per_request",
                        "client_cpu_cores",
                        "other_cpu_cores",
                    )
                },
                "throughput_spread": e.spread("throughput"),
                "repeats": e.repeats,
            }
            for e in entries
        ],
        "summary": results.summary(entries, args.concurrency_list),
        "cold_load": cold,
    }


if __name__ == "__main__":
    sys.exit(main())
