"""Repeats into medians, ratios to the engine alone, margins over the peers, tables, plot."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from bench.report import median_of
from zeroserve.bench.plot import PlotPoint, Series, write_plot

ENGINE: Final = "engine"
REFERENCE_BATCH: Final = 32
"""Served throughput is compared with the engine alone at this batch size."""
ZEROSERVE: Final = "zeroserve"
PEERS: Final = ("mlserver", "mlserver-default", "kserve", "triton")
PYTHON_MODEL: Final = "zeroserve-python"
TRITON: Final = "triton"
PROTOCOL_SUFFIXES: Final = {"json": "", "binary": "-binary", "grpc": "-grpc"}


@dataclass
class Entry:
    """One contender at one level (the engine: a batch size; servers: a concurrency)."""

    key: str
    title: str
    size: int
    repeats: list[dict[str, Any]] = field(default_factory=list)

    @property
    def is_engine(self) -> bool:
        return self.key == ENGINE

    def median(self, name: str) -> float:
        return median_of([r for r in self.repeats if not r.get("failed")], name)

    def spread(self, name: str) -> float:
        """(max - min) / median over the repeats."""
        values = [float(r[name]) for r in self.repeats if r.get(name) is not None]
        middle = statistics.median(values) if values else 0.0
        return (max(values) - min(values)) / middle if middle else math.nan

    @property
    def errors(self) -> int:
        return sum(int(r.get("error_count") or 0) for r in self.repeats)

    @property
    def failures(self) -> list[str]:
        return [str(r["failed"]) for r in self.repeats if r.get("failed")]


def find(entries: Sequence[Entry], key: str, size: int) -> Entry | None:
    return next((e for e in entries if e.key == key and e.size == size), None)


def engine_reference(entries: Sequence[Entry]) -> float:
    """The engine alone's median rows/s at the reference batch size (NaN if not measured)."""
    reference = find(entries, ENGINE, REFERENCE_BATCH)
    return reference.median("throughput") if reference is not None else math.nan


def summary(entries: Sequence[Entry], concurrencies: Sequence[int]) -> dict[str, Any]:
    """Per contender and concurrency: medians, ratio to the engine, and zeroserve's margins."""
    reference = engine_reference(entries)
    servers = _server_keys(entries)
    table: dict[str, Any] = {}
    for key in servers:
        rows = {}
        for c in concurrencies:
            entry = find(entries, key, c)
            if entry is None:
                continue
            throughput = entry.median("throughput")
            rows[str(c)] = {
                "throughput": throughput,
                "p50_ms": entry.median("p50_ms"),
                "p99_ms": entry.median("p99_ms"),
                "server_cpu_ms_per_request": entry.median("server_cpu_ms_per_request"),
                "ratio_to_engine_b32": throughput / reference if reference else math.nan,
                "throughput_spread": entry.spread("throughput"),
                "repeats": len(entry.repeats),
                "errors": entry.errors,
            }
        table[key] = rows
    margins: dict[str, Any] = {}
    for c in concurrencies:
        ours = find(entries, ZEROSERVE, c)
        peers = [e for k in PEERS if (e := find(entries, k, c)) is not None]
        peers = [e for e in peers if e.median("throughput") > 0]
        if ours is None or not peers:
            continue
        best = max(peers, key=lambda e: e.median("throughput"))
        margins[str(c)] = {
            "best_peer": best.key,
            "throughput_ratio": ours.median("throughput") / best.median("throughput"),
            "zeroserve_p99_ms": ours.median("p99_ms"),
            "best_peer_p99_ms": best.median("p99_ms"),
            "p99_at_or_below_best_peer": ours.median("p99_ms") <= best.median("p99_ms"),
        }
    return {
        "engine_b32_rows_per_s": reference,
        "servers": table,
        "zeroserve_vs_best_peer": margins,
        "native_onnx": native_onnx(entries, concurrencies),
    }


def native_onnx(entries: Sequence[Entry], concurrencies: Sequence[int]) -> dict[str, Any]:
    """zeroserve's ONNX runtime over the same ONNX Runtime call in a Python model, in
    zeroserve and in Triton, protocol by protocol: ``{protocol: {c: figures}}``, throughput
    ratios (issue 19's target is every one >= 1) and each server's CPU per request (on a
    shared machine the steadier figure)."""
    table: dict[str, Any] = {}
    for protocol, suffix in PROTOCOL_SUFFIXES.items():
        rows: dict[str, Any] = {}
        for c in concurrencies:
            ours = find(entries, ZEROSERVE + suffix, c)
            if ours is None or ours.median("throughput") <= 0:
                continue
            row: dict[str, Any] = {
                "onnx": ours.median("throughput"),
                "onnx_cpu_ms": ours.median("server_cpu_ms_per_request"),
            }
            for name, key in (("python_model", PYTHON_MODEL), ("triton", TRITON)):
                other = find(entries, key + suffix, c)
                if other is not None and other.median("throughput") > 0:
                    row[name] = other.median("throughput")
                    row[f"ratio_to_{name}"] = row["onnx"] / row[name]
                    row[f"{name}_cpu_ms"] = other.median("server_cpu_ms_per_request")
            if len(row) > 2:
                rows[str(c)] = row
        if rows:
            table[protocol] = rows
    return table


def native_onnx_lines(table: dict[str, Any]) -> list[str]:
    """:func:`native_onnx`'s ratios, one line per protocol and concurrency."""
    lines = []
    for protocol, rows in table.items():
        for c, row in rows.items():
            parts = [
                f"{protocol:<6} c={c:<3} ONNX runtime {row['onnx']:8,.0f}/s "
                f"({_cell(row['onnx_cpu_ms'], '.3f')} ms CPU/req)"
            ]
            for name, label in (("python_model", "Python model"), ("triton", "Triton")):
                if name in row:
                    parts.append(
                        f"{row[f'ratio_to_{name}']:.2f}x {label} ({row[name]:,.0f}/s, "
                        f"{_cell(row[f'{name}_cpu_ms'], '.3f')} ms CPU/req)"
                    )
            lines.append("; ".join(parts))
    return lines


LOADS: Final = {
    "wrk": "wrk (one thread, one pre-built batch-1 JSON body, closed loop)",
    "zeroserve-bench": "zeroserve bench (batch-1 JSON requests, random inputs, closed loop)",
}
"""What drove the servers, by ``--client`` name."""


def text_table(
    entries: Sequence[Entry], concurrencies: Sequence[int], repeats: int, client: str
) -> str:
    """The terminal table: one row per server and concurrency, the engine alone first."""
    reference = engine_reference(entries)
    header = (
        f"{'server':<26}{'level':>6}{'infer/s':>10}{'spread':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'/eng b32':>9}{'srv ms/req':>11}{'srv cpu':>8}{'other':>7}{'errors':>7}"
    )
    lines = [header, "-" * len(header)]
    for entry in entries:
        if entry.is_engine:
            level = f"b={entry.size}"
            ratio = entry.median("throughput") / reference if reference else math.nan
            cpu_ms = math.nan
        else:
            level = f"c={entry.size}"
            ratio = entry.median("throughput") / reference if reference else math.nan
            cpu_ms = entry.median("server_cpu_ms_per_request")
        lines.append(
            f"{entry.key:<26}{level:>6}{entry.median('throughput'):>10,.0f}"
            f"{_pct(entry.spread('throughput')):>8}{entry.median('p50_ms'):>9.2f}"
            f"{entry.median('p99_ms'):>9.2f}{_cell(ratio, '.2f'):>9}{_cell(cpu_ms, '.3f'):>11}"
            f"{_cell(entry.median('server_cpu_cores'), '.2f'):>8}"
            f"{_cell(entry.median('other_cpu_cores'), '.2f'):>7}"
            f"{'-' if entry.is_engine else str(entry.errors):>7}"
        )
        for why in entry.failures[:1]:
            lines.append(f"{'':<26}  failed: {why.splitlines()[-1] if why else why}")
    lines += [
        "",
        f"Load: {LOADS.get(client, client)}. "
        f"Medians of {repeats} repeat(s), servers alternated within each repeat. infer/s: "
        "batch-1 requests answered per second (engine: rows/s at batch b); /eng b32: over the "
        "engine alone at batch 32; srv ms/req: the server's process tree CPU per request; "
        "other: cores the rest of the machine used meanwhile (noise).",
    ]
    return "\n".join(lines)


def markdown_table(
    entries: Sequence[Entry], concurrencies: Sequence[int], titles: dict[str, str]
) -> str:
    """The README table: throughput per concurrency, latency and ratios at the highest."""
    reference = engine_reference(entries)
    top = max(concurrencies)
    head = "| server | " + " | ".join(f"c={c} infer/s" for c in concurrencies)
    head += f" | c={top} p50 / p99 ms | c={top} ÷ engine b={REFERENCE_BATCH} "
    head += f"| CPU ms/request (c={top}) |"
    lines = [head, "|" + " --- |" * (len(concurrencies) + 4)]
    engine_rows = [e for e in entries if e.is_engine]
    if engine_rows:
        engine_text = ", ".join(
            f"b={e.size}: {e.median('throughput'):,.0f} rows/s" for e in engine_rows
        )
        lines.append(
            f"| engine alone (ONNX Runtime, in process) | {engine_text} |"
            + " |" * (len(concurrencies) + 2)
        )
    for key in _server_keys(entries):
        cells: list[str] = []
        for c in concurrencies:
            entry = find(entries, key, c)
            cells.append(f"{entry.median('throughput'):,.0f}" if entry else "-")
        last = find(entries, key, top)
        if last is None:
            continue
        ratio = last.median("throughput") / reference if reference else math.nan
        latency = f"{_cell(last.median('p50_ms'), '.2f')} / {_cell(last.median('p99_ms'), '.1f')}"
        cpu_ms = _cell(last.median("server_cpu_ms_per_request"), ".2f")
        lines.append(
            f"| {titles.get(key, key)} | "
            + " | ".join(cells)
            + f" | {latency} | {_cell(ratio, '.2f')} | {cpu_ms} |"
        )
    return "\n".join(lines)


def cold_load_table(records: dict[str, list[dict[str, Any]]], titles: dict[str, str]) -> str:
    """Per contender: the first load (caches cold) and the median of all, load to first
    answer, and unload."""
    header = (
        f"{'server':<22}{'first s':>9}{'load s':>9}{'1st inf s':>10}{'total s':>9}"
        f"{'GB/s':>7}{'unload s':>9}"
    )
    lines = [header, "-" * len(header)]
    for key, runs in records.items():
        good = [r for r in runs if not r.get("failed")]
        if not good:
            why = runs[0].get("failed", "not measured") if runs else "not measured"
            lines.append(f"{key:<22}  failed: {str(why).splitlines()[0][:120]}")
            continue

        def med(name: str, rows: list[dict[str, Any]] = good) -> float:
            values = [float(r[name]) for r in rows if r.get(name) is not None]
            return statistics.median(values) if values else math.nan

        first = good[0].get("load_to_first_answer_s")
        lines.append(
            f"{key:<22}{_cell(first, '.2f'):>9}{med('load_s'):>9.2f}"
            f"{med('first_infer_s'):>10.3f}{med('load_to_first_answer_s'):>9.2f}"
            f"{med('gb_per_s'):>7.2f}{_cell(med('unload_s'), '.2f'):>9}"
        )
    lines += [
        "",
        "first s: the first load, first answer included (caches cold: zeroserve's node cache "
        "and engine cache fill then); the other columns are medians over all repeats.",
    ]
    return "\n".join(lines)


def plot(
    path: Path,
    entries: Sequence[Entry],
    concurrencies: Sequence[int],
    titles: dict[str, str],
    *,
    title: str,
    note: str,
) -> None:
    """Latency against throughput, one line per server, the engine alone as reference."""
    series = []
    for key in _server_keys(entries):
        points = []
        for c in concurrencies:
            entry = find(entries, key, c)
            if entry is not None and entry.median("throughput") > 0:
                points.append(
                    PlotPoint(
                        entry.median("throughput"),
                        entry.median("p50_ms"),
                        entry.median("p99_ms"),
                        f"c={c}",
                    )
                )
        series.append(Series(titles.get(key, key), tuple(points)))
    reference = engine_reference(entries)
    references = []
    if math.isfinite(reference):
        references.append((reference, f"engine alone, batch {REFERENCE_BATCH}"))
    write_plot(
        path,
        series,
        title=title,
        x_label="throughput (batch-1 inferences/s, median of repeats)",
        note=note,
        references=references,
    )


def _server_keys(entries: Sequence[Entry]) -> list[str]:
    keys: list[str] = []
    for entry in entries:
        if not entry.is_engine and entry.key not in keys:
            keys.append(entry.key)
    return keys


def _cell(value: float | None, spec: str) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return format(value, spec)


def _pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value * 100:.0f}%"
