"""GPU cold start of a real-size LLM from the node cache, against the floors under it.

Run on a machine with a CUDA GPU (the device tool's H200 here). A Llama-shaped model with
random weights (:func:`bench.tiny_llm.write_tiny_llm` at a real size: about 0.9 B
parameters, 3.6 GB of float32 safetensors, written locally, never downloaded) sits in a
node-cache folder; each repeat then measures, with the page cache dropped first where the
kernel allows it (recorded):

* **disk** — reading the weight file once (buffered, 8 MiB chunks): the storage floor;
* **safetensors → cuda** — ``safetensors.torch.load_file(device="cuda:0")``: the floor of
  putting those bytes on the device with no model code;
* **phases** — a fresh interpreter importing torch and transformers, creating the CUDA
  context, ``from_pretrained(device_map="cuda:0")`` and one token of plain ``generate``:
  where the seconds go without zeroserve;
* **zeroserve** — ``TransformersRuntime.load`` on ``cuda:0`` (engine process start, model
  build, weights on the GPU) until READY, then the first generated token, both with a new
  engine process and with a spare one started beforehand (``spare_*``, what a worker keeps);
  device memory in use after load and after unload (the gap to the level before the load is
  what unload failed to give back).

Medians of the repeats, every figure also as GB/s of the weight bytes. Results go to
``bench/results/<UTC time>-<tag>-gpu_cold_start.json``.

    python -m bench.gpu_cold_start --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MIB = 2**20
SPARE_WARM_S = 20.0
"""How long a spare engine process is given to import torch and transformers."""

PHASES = """
import json, sys, time
marks = {"start": time.perf_counter()}
import torch
marks["import_torch"] = time.perf_counter()
from transformers import AutoModelForCausalLM
marks["import_transformers"] = time.perf_counter()
torch.zeros(1, device="cuda:0"); torch.cuda.synchronize()
marks["cuda_context"] = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(
    sys.argv[1], dtype="auto", use_safetensors=True, local_files_only=True, device_map="cuda:0"
).eval()
torch.cuda.synchronize()
marks["weights_on_device"] = time.perf_counter()
ids = torch.tensor([[0, 5, 6, 7]], device="cuda:0")
model.generate(ids, max_new_tokens=1, do_sample=False)
torch.cuda.synchronize()
marks["first_token_plain_generate"] = time.perf_counter()
names = list(marks)
print(json.dumps({b: marks[b] - marks[a] for a, b in zip(names, names[1:])}))
"""
"""Where a cold start's seconds go without zeroserve: a fresh interpreter's imports, the CUDA
context, transformers putting the weights on the device, and one token from plain
``generate``."""


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=24, help="decoder layers of the model")
    parser.add_argument("--hidden", type=int, default=2048, help="hidden size of the model")
    parser.add_argument("--repeats", type=int, default=3, help="cold starts measured")
    parser.add_argument("--tag", default="h200", help="machine tag in the result's file name")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="result folder")
    return parser.parse_args(argv)


def drop_page_cache() -> bool:
    """Drop the kernel's page cache; False where the machine does not allow it."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def machine() -> dict[str, Any]:
    import torch

    smi = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=name,memory.total,driver_version",
            "--format=csv,noheader",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "gpu": smi,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_average": os.getloadavg(),
    }


def read_disk(path: Path) -> float:
    started = time.perf_counter()
    with path.open("rb", buffering=0) as file:
        while file.read(8 * MIB):
            pass
    return time.perf_counter() - started


def load_safetensors_cuda(path: Path) -> float:
    import torch
    from safetensors.torch import load_file

    torch.cuda.synchronize()
    started = time.perf_counter()
    tensors = load_file(str(path), device="cuda:0")
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    del tensors
    torch.cuda.empty_cache()
    return elapsed


async def zeroserve_cold_start(model_dir: Path, *, spare: bool) -> dict[str, float]:
    """One load to the first token and unload; with ``spare``, into an engine process
    started (torch and transformers imported) before the clock starts, as a worker keeps."""
    from foundation import model_config
    from runtimes.base import RuntimeOptions
    from runtimes.llm.engine_process.client import SpareEngines
    from runtimes.llm.hf import TransformersRuntime
    from runtimes.llm.options import LLMOptions
    from runtimes.sampling import SamplingParams
    from runtimes.torch import device_memory_in_use_bytes

    before = device_memory_in_use_bytes("cuda:0")
    config = model_config.read_config_file(model_dir)
    assert config is not None
    TransformersRuntime.complete_config(model_dir / "1", config)
    spares = SpareEngines() if spare else None
    if spares is not None:
        spares.refill()
        # The spare's imports run in the child after the spawn returns; give them time.
        await asyncio.sleep(SPARE_WARM_S)
    runtime = TransformersRuntime(
        name=model_dir.name,
        version=1,
        options=RuntimeOptions(drain_timeout_s=0.0),
        llm_options=LLMOptions(spare_engines=spares),
    )
    started = time.perf_counter()
    await runtime.load(model_dir / "1", config, "cuda:0")
    ready = time.perf_counter()
    ids = await runtime.encode("the cat river")
    first = None
    async for _ in runtime.generate(ids, SamplingParams(max_tokens=8, temperature=0.0)):
        if first is None:
            first = time.perf_counter()
    loaded = device_memory_in_use_bytes("cuda:0")
    await runtime.unload()
    if spares is not None:
        spares.close()
    after = device_memory_in_use_bytes("cuda:0")
    return {
        "load_s": ready - started,
        "first_token_s": (first or ready) - ready,
        "ready_to_first_token_total_s": (first or ready) - started,
        "device_mib_before": before / MIB,
        "device_mib_loaded": loaded / MIB,
        "device_mib_after_unload": after / MIB,
    }


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    import torch

    from bench.tiny_llm import write_tiny_llm

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return 2
    torch.cuda.init()  # type: ignore[no-untyped-call]
    results: dict[str, Any] = {"suite": "gpu_cold_start", "machine": machine()}
    with tempfile.TemporaryDirectory(prefix="zs-gpu-cold-") as tmp:
        started = time.perf_counter()
        model_dir = write_tiny_llm(
            Path(tmp), "llm", layers=args.layers, hidden=args.hidden, max_model_len=2048
        )
        weights = model_dir / "1" / "model.safetensors"
        size = weights.stat().st_size
        results["model"] = {
            "layers": args.layers,
            "hidden": args.hidden,
            "weight_bytes": size,
            "write_s": time.perf_counter() - started,
        }
        print(f"model written: {size / 1e9:.2f} GB", flush=True)
        floors: list[dict[str, float]] = []
        starts: list[dict[str, float]] = []
        dropped: list[bool] = []
        for _ in range(args.repeats):
            dropped.append(drop_page_cache())
            disk = read_disk(weights)
            drop_page_cache()
            to_cuda = load_safetensors_cuda(weights)
            floors.append({"disk_s": disk, "safetensors_cuda_s": to_cuda})
            drop_page_cache()
            phases = subprocess.run(
                [sys.executable, "-c", PHASES, str(model_dir / "1")],
                capture_output=True,
                text=True,
                check=True,
                timeout=600,
            )
            floors[-1].update(json.loads(phases.stdout.strip().splitlines()[-1]))
            drop_page_cache()
            cold = asyncio.run(zeroserve_cold_start(model_dir, spare=False))
            drop_page_cache()
            warm = asyncio.run(zeroserve_cold_start(model_dir, spare=True))
            starts.append({**cold, **{f"spare_{key}": value for key, value in warm.items()}})
            print(floors[-1], starts[-1], flush=True)
        results["page_cache_dropped"] = dropped
        results["floors"] = floors
        results["zeroserve"] = starts
        floor = median(floors)
        start = median(starts)
        gb = size / 1e9
        results["median"] = {
            **floor,
            **start,
            "disk_gb_s": gb / floor["disk_s"],
            "safetensors_cuda_gb_s": gb / floor["safetensors_cuda_s"],
            "zeroserve_load_gb_s": gb / start["load_s"],
            "zeroserve_load_over_safetensors": start["load_s"] / floor["safetensors_cuda_s"],
            "zeroserve_spare_load_gb_s": gb / start["spare_load_s"],
        }
    print(json.dumps(results["median"], indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    path = args.out / f"{stamp}-{args.tag}-gpu_cold_start.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
