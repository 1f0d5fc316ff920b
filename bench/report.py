"""Results: measured points with their raw repeats, medians, ratios, targets, table and JSON."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

ENGINE: Final = "engine"
SERVER: Final = "server"
REFERENCE_BATCH: Final = 32
"""Served throughput is compared with the engine alone at this batch size."""
NOISY_OTHER_CORES: Final = 0.25
"""Mean CPU (cores) of other processes during the points above which the table warns."""


@dataclass
class Point:
    """One configuration: the engine at a batch size, or the server at a concurrency."""

    model: str
    kind: str
    """``engine`` or ``server``."""
    encoding: str | None
    """``json`` or ``binary`` for the server; None for the engine."""
    size: int
    """Batch size (engine) or concurrent connections of batch-1 requests (server)."""
    repeats: list[dict[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        if self.kind == ENGINE:
            return f"engine  b={self.size}"
        return f"server  {self.encoding:<6} c={self.size}"

    def median(self, key: str) -> float:
        return median_of(self.repeats, key)

    def spread(self, key: str) -> float:
        """(max - min) / median over the repeats: how noisy the point is."""
        values = [float(r[key]) for r in self.repeats]
        middle = statistics.median(values) if values else 0.0
        return (max(values) - min(values)) / middle if middle else float("nan")


@dataclass(frozen=True)
class Target:
    """One of the issue's targets, evaluated on the medians."""

    name: str
    description: str
    value: float
    threshold: float
    is_max: bool
    """True when ``value`` must stay at or below ``threshold``."""

    @property
    def passed(self) -> bool:
        return self.value <= self.threshold if self.is_max else self.value >= self.threshold


def median_of(repeats: list[dict[str, Any]], key: str) -> float:
    """The median of ``key`` over the repeats that have it; NaN when none has."""
    values = [float(r[key]) for r in repeats if r.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def find(
    points: list[Point], model: str, kind: str, size: int, encoding: str | None = None
) -> Point | None:
    return next(
        (
            p
            for p in points
            if (p.model, p.kind, p.size, p.encoding) == (model, kind, size, encoding) and p.repeats
        ),
        None,
    )


def ratio_to_engine(points: list[Point], point: Point) -> float | None:
    """Median throughput of ``point`` over the engine alone's at batch 32 (same model)."""
    reference = find(points, point.model, ENGINE, REFERENCE_BATCH)
    if reference is None or point.kind != SERVER:
        return None
    return point.median("throughput") / reference.median("throughput")


def evaluate_targets(points: list[Point]) -> list[Target]:
    """The issue's targets, for every encoding measured where it names none."""
    targets: list[Target] = []
    light = find(points, "light", SERVER, 64, "binary")
    if light is not None:
        targets.append(
            Target(
                "light_c64_binary_throughput",
                "light MLP, c=64, binary: served infer/s >= 3600",
                light.median("throughput"),
                3600.0,
                is_max=False,
            )
        )
        targets.append(
            Target(
                "light_c64_binary_p99",
                "light MLP, c=64, binary: p99 <= 50 ms",
                light.median("p99_ms"),
                50.0,
                is_max=True,
            )
        )
    for encoding in ("binary", "json"):
        heavy = find(points, "heavy", SERVER, 64, encoding)
        ratio = ratio_to_engine(points, heavy) if heavy is not None else None
        if ratio is not None:
            targets.append(
                Target(
                    f"heavy_c64_{encoding}_ratio",
                    f"heavy MLP, c=64, {encoding}: served / engine-alone b=32 >= 0.85",
                    ratio,
                    0.85,
                    is_max=False,
                )
            )
    for model in ("light", "heavy"):
        engine = find(points, model, ENGINE, 1)
        for encoding in ("binary", "json"):
            served = find(points, model, SERVER, 1, encoding)
            if engine is None or served is None:
                continue
            targets.append(
                Target(
                    f"{model}_c1_{encoding}_p50",
                    f"{model} MLP, c=1, {encoding}: p50 <= engine-alone b=1 p50 + 1 ms",
                    served.median("p50_ms"),
                    engine.median("p50_ms") + 1.0,
                    is_max=True,
                )
            )
    return targets


def table(points: list[Point], titles: dict[str, str]) -> str:
    """The medians as a fixed-width table, one section per model."""
    header = (
        f"{'configuration':<22}{'infer/s':>10}{'spread':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'/eng b32':>9}{'batch':>7}{'srv cpu':>8}{'cli cpu':>8}{'other':>7}{'errors':>7}"
    )
    lines: list[str] = []
    for model, title in titles.items():
        rows = [p for p in points if p.model == model and p.repeats]
        if not rows:
            continue
        lines += ["", title, header, "-" * len(header)]
        for p in rows:
            ratio = ratio_to_engine(points, p)
            if p.kind == SERVER:
                batch = p.median("avg_batch")
                cpu = p.median("server_cpu_cores")
                client_cpu: float | None = p.median("client_cpu_cores")
                errors: int | None = sum(int(r.get("error_count", 0)) for r in p.repeats)
            else:
                batch, cpu, client_cpu, errors = p.size, p.median("cpu_cores"), None, None
            lines.append(
                f"{p.label:<22}{p.median('throughput'):>10.1f}"
                f"{p.spread('throughput') * 100:>7.0f}%"
                f"{p.median('p50_ms'):>9.2f}{p.median('p99_ms'):>9.2f}"
                f"{_cell(ratio, '.2f'):>9}{_cell(batch, '.1f'):>7}{_cell(cpu, '.2f'):>8}"
                f"{_cell(client_cpu, '.2f'):>8}{_cell(p.median('other_cpu_cores'), '.2f'):>7}"
                f"{_cell(errors, 'd'):>7}"
            )
    others = [p.median("other_cpu_cores") for p in points if p.repeats]
    noise = statistics.mean(others) if others else 0.0
    if noise > NOISY_OTHER_CORES:
        lines += [
            "",
            f"WARNING: other processes used {noise:.2f} cores on average while points were "
            "measured; compare spreads before trusting small differences.",
        ]
    lines += [
        "",
        "infer/s: batch-1 inferences (engine: rows) per second, median of repeats; spread: "
        "(max-min)/median; /eng b32: served infer/s over the engine alone at batch 32; batch: "
        "rows per engine execution (server stats); cpu: cores used (engine rows: this process); "
        "other: cores the rest of the machine used meanwhile (noise).",
    ]
    return "\n".join(lines)


def targets_text(targets: list[Target]) -> str:
    lines = ["", "targets:"]
    for t in targets:
        verdict = "PASS" if t.passed else "FAIL"
        relation = "<=" if t.is_max else ">="
        lines.append(
            f"  [{verdict}] {t.description}: {t.value:.2f} (needs {relation} {t.threshold:.2f})"
        )
    return "\n".join(lines)


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def points_json(points: list[Point]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in points:
        if not p.repeats:
            continue
        keys = ["throughput", "p50_ms", "p90_ms", "p99_ms"]
        keys += (
            ["avg_batch", "server_cpu_cores", "client_cpu_cores"]
            if p.kind == SERVER
            else ["cpu_cores"]
        )
        keys.append("other_cpu_cores")
        out.append(
            {
                "model": p.model,
                "kind": p.kind,
                "encoding": p.encoding,
                "batch_size": p.size if p.kind == ENGINE else 1,
                "concurrency": p.size if p.kind == SERVER else None,
                "median": {k: p.median(k) for k in keys},
                "throughput_spread": p.spread("throughput"),
                "ratio_to_engine_b32": ratio_to_engine(points, p),
                "repeats": p.repeats,
            }
        )
    return out


def _cell(value: float | int | None, spec: str) -> str:
    if value is None or value != value:  # NaN
        return "-"
    return format(value, spec)
