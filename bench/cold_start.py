"""Cold-start benchmark: where the time of a cold start goes, against the local-disk floor.

One run on one machine, for a generated ONNX model of about 1 GiB (an MLP of 8192x8192 FP32
MatMuls, weights inside the .onnx file as usually shipped):

* **floor** — reading the model file from local disk with a cold page cache (the fastest of a
  buffered read, a 4-thread O_DIRECT read and a memory-mapped read with readahead, each the
  median of 3), in GB/s;
* **fetch** — ``NodeCache.fetch`` from an S3-compatible server on loopback (``s3rver``,
  which serves ranges from disk; moto re-reads the whole object per ranged GET), with and
  without checksum verification (s3rver only offers an MD5 ETag, and MD5 runs at ~0.3 GB/s),
  next to the server's own ceiling (plain parallel HTTP GETs, bytes discarded);
* **load** — ``OnnxRuntime.load`` from the node cache with a cold page cache: the engine
  build (no warm engine cache), then warm-engine-cache hits with weight prepacking on and
  off, each with its first inference; and config auto-complete (which runs before every
  load), reading the graph's interface against parsing the whole file with ``onnx.load``;
* **transfer tuning** — a 128 MiB object through a proxy that limits each connection to a
  fixed rate (as S3 limits each connection): one stream, the default settings, tuned ones.

Every time is also given as a bandwidth (model bytes / seconds) and as a ratio to the floor.
Target: a load from the node cache (excluding the engine build) reaches >= 80% of the
floor's bandwidth. Results go to ``bench/results/<UTC time>-<tag>-cold_start.json``.

    npm install -g s3rver@3.7.1     # once
    python bench/cold_start.py      # about 4-6 minutes on 2 cores
    python bench/cold_start.py --quick   # smoke run: 256 MiB, one repeat
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import mmap
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3
import numpy as np
import onnx
from onnx import TensorProto, helper
from prometheus_client import CollectorRegistry

from bench import machine, report
from data_plane.storage import CacheSettings, NodeCache, create_s3_client, parse_storage_uri
from foundation.proto import model_config_pb2 as mc
from runtimes.base import RuntimeOptions
from runtimes.onnx.builder import DISABLE_PREPACKING_PARAMETER
from runtimes.onnx.runtime import OnnxRuntime

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "bench" / "results"
HOST = "127.0.0.1"
BUCKET = "models"
CREDENTIALS = {"aws_access_key_id": "S3RVER", "aws_secret_access_key": "S3RVER"}
WIDTH = 8192
"""MLP width: one 8192x8192 FP32 layer is 256 MiB."""
MIB = 2**20


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--size-mib", type=int, default=1024, help="model size (x256 MiB)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per load point; medians")
    parser.add_argument("--s3rver", default=shutil.which("s3rver") or "s3rver")
    parser.add_argument("--rate-mb", type=float, default=4.0, help="per-connection MB/s limit")
    parser.add_argument("--tuning-mib", type=int, default=128, help="tuning object size")
    parser.add_argument("--workdir", type=Path, help="scratch folder on the disk to measure")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: a 256 MiB model, 1 repeat, 16 MiB tuning"
    )
    parser.add_argument("--tag", help="machine tag in the results file name (default: hostname)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no results file")
    parser.add_argument("--serve-proxy", nargs=3, metavar=("PORT", "UPSTREAM", "RATE"))
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mib, args.repeats, args.tuning_mib = 256, 1, 16
    return args


# ---- model, page cache, floor ----


def write_model(path: Path, size_mib: int) -> None:
    """An MLP of ``size_mib / 256`` square MatMul+Add layers, weights inside the file."""
    layers = max(1, size_mib // 256)
    rng = np.random.default_rng(0)
    nodes, initializers, current = [], [], "INPUT0"
    for i in range(layers):
        w = rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) * np.float32(1 / 90.5)
        initializers.append(
            helper.make_tensor(f"w{i}", TensorProto.FLOAT, w.shape, w.tobytes(), raw=True)
        )
        initializers.append(helper.make_tensor(f"b{i}", TensorProto.FLOAT, [WIDTH], [0.0] * WIDTH))
        out = "OUTPUT0" if i == layers - 1 else f"h{i}"
        nodes += [
            helper.make_node("MatMul", [current, f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [out]),
        ]
        current = out
        del w
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", WIDTH])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as file:
        file.write(model.SerializeToString())
        file.flush()
        os.fsync(file.fileno())


def drop_page_cache(*paths: Path) -> None:
    """Evict the files under ``paths`` from the page cache (clean pages; fsync first)."""
    for root in paths:
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for file in files:
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def read_buffered(path: Path, chunk: int = 8 * MIB) -> float:
    drop_page_cache(path)
    buffer = memoryview(bytearray(chunk))
    started = time.perf_counter()
    with path.open("rb", buffering=0) as file:
        while file.readinto(buffer):
            pass
    return time.perf_counter() - started


def read_direct(path: Path, threads: int = 4, chunk: int = 8 * MIB) -> float:
    drop_page_cache(path)
    size = path.stat().st_size
    offsets = list(range(0, size, chunk))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buffers = [mmap.mmap(-1, chunk) for _ in range(threads)]  # page-aligned, as O_DIRECT needs

    def work(index: int) -> None:
        for offset in offsets[index::threads]:
            os.preadv(fd, [buffers[index]], offset)

    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, range(threads)))
        return time.perf_counter() - started
    finally:
        os.close(fd)


def read_mapped(path: Path) -> float:
    """Sequential read through a memory map with kernel readahead (ORT's own path)."""
    drop_page_cache(path)
    size = path.stat().st_size
    started = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mapped:
            total = 0
            for offset in range(0, size, mmap.PAGESIZE):
                total += mapped[offset]
    finally:
        os.close(fd)
    return time.perf_counter() - started


def server_ceiling(port: int, key: str, size: int, threads: int = 8) -> float:
    """Seconds for plain HTTP ranged GETs of the whole object, bytes discarded: what the
    server and loopback give without boto3, checksums or the disk on our side."""
    part = 8 * MIB
    spans = [(start, min(start + part, size) - 1) for start in range(0, size, part)]

    def work(index: int) -> None:
        connection = http.client.HTTPConnection(HOST, port, timeout=60)
        buffer = memoryview(bytearray(MIB))
        try:
            for start, end in spans[index::threads]:
                connection.request(
                    "GET", f"/{BUCKET}/{key}", headers={"Range": f"bytes={start}-{end}"}
                )
                response = connection.getresponse()
                while response.readinto(buffer):
                    pass
        finally:
            connection.close()

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))
    return time.perf_counter() - started


# ---- S3-compatible servers ----


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"{what} did not listen on {port}")


@contextmanager
def running(command: list[str], port: int, what: str) -> Iterator[None]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process, what)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def serve_throttled_proxy(port: int, upstream: int, rate: float) -> None:
    """A TCP proxy that paces each connection's server-to-client bytes at ``rate`` B/s."""

    async def pump(reader: Any, writer: Any, limit: float | None) -> None:
        try:
            while data := await reader.read(64 * 1024):
                writer.write(data)
                await writer.drain()
                if limit:
                    await asyncio.sleep(len(data) / limit)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def handle(client_reader: Any, client_writer: Any) -> None:
        up_reader, up_writer = await asyncio.open_connection(HOST, upstream)
        await asyncio.gather(
            pump(client_reader, up_writer, None), pump(up_reader, client_writer, rate)
        )

    server = await asyncio.start_server(handle, HOST, port)
    async with server:
        await server.serve_forever()


def s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **CREDENTIALS)


# ---- measurements ----


def fetch(root: Path, endpoint: str, key: str, **overrides: Any) -> tuple[float, Path]:
    """Seconds to fetch ``s3://models/<key>`` into an empty cache at ``root``."""
    shutil.rmtree(root, ignore_errors=True)
    settings = CacheSettings(root=root, max_bytes=64 * 2**30, **overrides)

    async def run() -> tuple[float, Path]:
        cache = NodeCache(
            settings,
            registry=CollectorRegistry(),
            s3_client_factory=lambda: create_s3_client(
                settings, endpoint_url=endpoint, region_name="us-east-1", **CREDENTIALS
            ),
        )
        uri = parse_storage_uri(f"s3://{BUCKET}/{key}", allowed=[f"s3://{BUCKET}"])
        try:
            started = time.perf_counter()
            cached = await cache.fetch(uri, model="bench")
            elapsed = time.perf_counter() - started
            cached.unpin()
            return elapsed, cached.path
        finally:
            await cache.close()

    return asyncio.run(run())


def load(model_dir: Path, engine_root: Path | None, *, prepack: bool) -> dict[str, Any]:
    """One cold load of ``model_dir/1/model.onnx``: load and first-inference seconds."""
    config = mc.ModelConfig(name="bench", backend="onnxruntime", max_batch_size=0)
    config.parameters[DISABLE_PREPACKING_PARAMETER].string_value = "false" if prepack else "true"
    x = np.ones((1, WIDTH), dtype=np.float32)

    async def run() -> dict[str, Any]:
        runtime = OnnxRuntime(name="bench", version=1, options=RuntimeOptions(engine_root))
        started = time.perf_counter()
        await runtime.load(model_dir / "1", config, "cpu")
        loaded = time.perf_counter()
        await runtime.infer({"INPUT0": x})
        first = time.perf_counter()
        await runtime.infer({"INPUT0": x})
        second = time.perf_counter()
        hit = runtime.engine_cache_hit
        await runtime.unload()
        return {
            "load_s": loaded - started,
            "first_inference_s": first - loaded,
            "second_inference_s": second - first,
            "total_s": first - started,
            "engine_cache_hit": hit,
        }

    return asyncio.run(run())


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("load_s", "first_inference_s", "second_inference_s", "total_s")
    return {k: statistics.median(r[k] for r in runs) for k in keys} | {
        "runs": runs,
        "engine_cache_hit": runs[0]["engine_cache_hit"],
    }


def repeat(count: int, step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    return median_of([step() for _ in range(count)])


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.serve_proxy:
        port, upstream, rate = args.serve_proxy
        asyncio.run(serve_throttled_proxy(int(port), int(upstream), float(rate)))
        return 0
    if shutil.which(args.s3rver) is None:
        raise SystemExit("s3rver not found: npm install -g s3rver@3.7.1 (or --s3rver PATH)")
    started_utc = datetime.now(UTC)
    started = time.monotonic()
    results: dict[str, Any] = {"started": started_utc.isoformat(timespec="seconds")}
    with tempfile.TemporaryDirectory(prefix="zeroserve-cold-", dir=args.workdir) as tmp:
        work = Path(tmp)
        model_file = work / "src" / "model.onnx"
        t = time.perf_counter()
        write_model(model_file, args.size_mib)
        size = model_file.stat().st_size
        print(f"model: {size / 1e9:.3f} GB written in {time.perf_counter() - t:.1f} s", flush=True)

        methods: dict[str, Callable[[Path], float]] = {
            "buffered": read_buffered,
            "direct_4_threads": read_direct,
            "mmap": read_mapped,
        }
        reads = {n: statistics.median(f(model_file) for _ in range(3)) for n, f in methods.items()}
        floor_s = min(reads.values())
        floor = size / floor_s / 1e9
        results["floor"] = {f"{n}_gbps": size / t / 1e9 for n, t in reads.items()} | {
            "gbps": floor,
            "seconds": floor_s,
        }
        print(f"floor: {floor:.2f} GB/s ({floor_s:.3f} s)", flush=True)

        port = free_port()
        endpoint = f"http://{HOST}:{port}"
        s3rver = [args.s3rver, "-d", str(work / "s3rver"), "-a", HOST, "-p", str(port), "-s"]
        (work / "s3rver").mkdir()
        with running(s3rver, port, "s3rver"):
            client = s3(endpoint)
            client.create_bucket(Bucket=BUCKET)
            t = time.perf_counter()
            client.upload_file(str(model_file), BUCKET, "mlp/1/model.onnx")
            print(f"uploaded to s3rver in {time.perf_counter() - t:.1f} s", flush=True)
            ceiling = statistics.median(
                server_ceiling(port, "mlp/1/model.onnx", size) for _ in range(2)
            )
            fetches: dict[str, Any] = {
                "server ceiling (raw HTTP, 8 x 8 MiB, bytes discarded)": {
                    "seconds": ceiling,
                    "gbps": size / ceiling / 1e9,
                }
            }
            print(f"s3rver ceiling: {ceiling:.2f} s", flush=True)
            for name, verify in (("verified", True), ("unverified", False)):
                seconds, cached_dir = fetch(
                    work / f"fetch-{name}", endpoint, "mlp", verify_checksums=verify
                )
                fetches[f"fetch, {name}"] = {"seconds": seconds, "gbps": size / seconds / 1e9}
                print(f"fetch ({name}): {seconds:.2f} s", flush=True)
            results["fetch"] = fetches | {"settings": "defaults: 8 x 8 MiB ranged GETs"}

            # Transfer tuning: each connection limited, as S3 limits each connection.
            tuning_key = "tuning/1/model.onnx"
            client.put_object(Bucket=BUCKET, Key=tuning_key, Body=os.urandom(args.tuning_mib * MIB))
            proxy_port = free_port()
            rate = args.rate_mb * 1e6
            proxy = [
                sys.executable,
                __file__,
                "--serve-proxy",
                str(proxy_port),
                str(port),
                str(rate),
            ]
            tuning = {}
            with running(proxy, proxy_port, "throttling proxy"):
                for name, overrides in (
                    ("one stream (1 x 8 MiB)", {"concurrency": 1}),
                    ("defaults (8 x 8 MiB)", {}),
                    ("tuned (32 x 4 MiB)", {"concurrency": 32, "part_size_bytes": 4 * MIB}),
                ):
                    seconds, _ = fetch(
                        work / "fetch-tuning",
                        f"http://{HOST}:{proxy_port}",
                        "tuning",
                        verify_checksums=False,
                        **overrides,
                    )
                    tuning[name] = {
                        "seconds": seconds,
                        "mbps": args.tuning_mib * MIB / seconds / 1e6,
                    }
                    print(f"tuning {name}: {seconds:.2f} s", flush=True)
            names = list(tuning)
            results["tuning"] = {
                "per_connection_mbps": args.rate_mb,
                "object_mib": args.tuning_mib,
                "points": tuning,
                "tuned_over_defaults": tuning[names[1]]["seconds"] / tuning[names[2]]["seconds"],
                "tuned_over_one_stream": tuning[names[0]]["seconds"] / tuning[names[2]]["seconds"],
            }

        # Loads from the node cache (the verified fetch's folder), page cache cold each time.
        engines = work / "engines"
        loads: dict[str, Any] = {}

        def cold_build(engine_root: Path | None) -> dict[str, Any]:
            shutil.rmtree(engines, ignore_errors=True)
            drop_page_cache(cached_dir)
            return load(cached_dir, engine_root, prepack=True)

        def cold_hit(prepack: bool) -> dict[str, Any]:
            drop_page_cache(cached_dir, engines)
            return load(cached_dir, engines, prepack=prepack)

        loads["no engine cache"] = repeat(args.repeats, lambda: cold_build(None))
        print(f"load, no engine cache: {loads['no engine cache']['total_s']:.2f} s", flush=True)
        loads["engine build (cache miss)"] = repeat(
            max(1, args.repeats - 1), lambda: cold_build(engines)
        )
        print(f"load, engine build: {loads['engine build (cache miss)']['total_s']:.2f} s")
        for prepack in (True, False):
            name = f"warm engine cache, prepacking {'on' if prepack else 'off'}"
            loads[name] = repeat(args.repeats, partial(cold_hit, prepack))
            print(f"load, {name}: {loads[name]['total_s']:.2f} s", flush=True)

        def autocomplete(scan: bool) -> float:
            drop_page_cache(cached_dir)
            started = time.perf_counter()
            if scan:
                OnnxRuntime.complete_config(cached_dir / "1", mc.ModelConfig(name="bench"))
            else:  # what auto-complete did before: parse the whole model
                onnx.load(str(cached_dir / "1" / "model.onnx"), load_external_data=False)
            return time.perf_counter() - started

        results["autocomplete_s"] = {
            "graph interface scan": statistics.median(autocomplete(True) for _ in range(3)),
            "onnx.load (before)": autocomplete(False),
        }
        weights = sum(p.stat().st_size for p in engines.rglob("model.onnx*") if p.is_file())
        for point in loads.values():
            point["gbps"] = size / point["total_s"] / 1e9
            point["ratio_to_floor"] = floor_s / point["total_s"]
        results["loads"] = loads
        results["engine_cache_bytes"] = weights

    best = max(
        (p for n, p in loads.items() if n.startswith("warm")), key=lambda p: p["ratio_to_floor"]
    )
    results["target"] = {
        "what": "load from the node cache (warm engine, incl. first inference) >= 0.8 x floor",
        "ratio": best["ratio_to_floor"],
        "passed": best["ratio_to_floor"] >= 0.8,
    }
    results["model_bytes"] = size
    results["duration_s"] = time.monotonic() - started
    text = render(results)
    print(text)
    if not args.no_save:
        stamp = started_utc.strftime("%Y-%m-%dT%H%M%SZ")
        tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", args.tag or socket.gethostname()).strip("-")
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        results["machine"] = machine.describe(REPO_ROOT, load_generator="none")
        path = RESULTS_DIR / f"{stamp}-{tag or 'host'}-cold_start.json"
        report.write_json(path, results)
        path.with_suffix(".txt").write_text(text + "\n")
        print(f"results: {path.relative_to(REPO_ROOT)}")
    return 0


def render(results: dict[str, Any]) -> str:
    floor = results["floor"]
    size = results["model_bytes"]
    rows = [("floor: local disk read, cold", floor["seconds"], floor["gbps"], 1.0)]
    for name, point in results["fetch"].items():
        if isinstance(point, dict):
            rows.append(
                (
                    f"fetch from s3rver ({name})",
                    point["seconds"],
                    point["gbps"],
                    point["gbps"] / floor["gbps"],
                )
            )
    for name, point in results["loads"].items():
        rows.append((f"load: {name}", point["total_s"], point["gbps"], point["ratio_to_floor"]))
    lines = [
        f"model {size / 1e9:.3f} GB; floor {floor['gbps']:.2f} GB/s "
        f"(best of: buffered {floor['buffered_gbps']:.2f}, "
        f"O_DIRECT x4 {floor['direct_4_threads_gbps']:.2f}, mmap {floor['mmap_gbps']:.2f})",
        "",
        f"{'step':<52} {'seconds':>8} {'GB/s':>7} {'x floor':>8}",
    ]
    lines += [f"{n:<52} {s:>8.3f} {g:>7.3f} {r:>8.2f}" for n, s, g, r in rows]
    lines += ["", f"{'load detail':<44} {'load s':>8} {'1st inf s':>10} {'2nd inf s':>10}"]
    for name, point in results["loads"].items():
        lines.append(
            f"{name:<44} {point['load_s']:>8.3f} {point['first_inference_s']:>10.3f} "
            f"{point['second_inference_s']:>10.3f}"
        )
    lines.append("")
    for name, seconds in results["autocomplete_s"].items():
        lines.append(f"config auto-complete, {name:<36} {seconds:>8.3f} s")
    tuning = results["tuning"]
    lines += [
        "",
        f"transfer tuning: {tuning['object_mib']} MiB, each connection limited to "
        f"{tuning['per_connection_mbps']:g} MB/s",
    ]
    for name, point in tuning["points"].items():
        lines.append(f"  {name:<28} {point['seconds']:>7.2f} s {point['mbps']:>8.1f} MB/s")
    lines.append(
        f"  tuned is {tuning['tuned_over_defaults']:.1f}x the defaults and "
        f"{tuning['tuned_over_one_stream']:.1f}x one stream"
    )
    target = results["target"]
    lines += [
        "",
        f"target: {target['what']}: {target['ratio']:.2f} "
        f"-> {'PASS' if target['passed'] else 'FAIL'}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
