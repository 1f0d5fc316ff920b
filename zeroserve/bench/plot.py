"""Latency against throughput as a PNG: one colour per series, p50 solid and p99 dashed.

Drawn with matplotlib's object API on an Agg canvas (no pyplot, no global backend switch), so
it works without a display and leaves no state behind. matplotlib is an optional dependency
(the ``bench`` extra): without it, :func:`write_plot` raises :class:`PlotUnavailableError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


@dataclass(frozen=True)
class PlotPoint:
    """One level: what it served and how long its answers took."""

    throughput: float
    p50_ms: float
    p99_ms: float
    label: str


@dataclass(frozen=True)
class Series:
    """One server (or one run) as a line through its levels."""

    name: str
    points: tuple[PlotPoint, ...]


def write_plot(
    path: Path,
    series: Sequence[Series],
    *,
    title: str,
    x_label: str = "throughput (successful requests/s)",
    note: str | None = None,
    references: Sequence[tuple[float, str]] = (),
) -> None:
    """Write the PNG at ``path`` (folders created); latency on a log scale.

    ``references`` are vertical lines at a throughput, each with its label (for example
    the engine alone's rate, which no server can pass).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailableError(
            "--plot needs matplotlib: pip install 'zeroserve[bench]'"
        ) from None
    figure = Figure(figsize=(11.0, 5.5), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    colours = [f"C{i % 10}" for i in range(len(series))]
    for colour, line in zip(colours, series, strict=True):
        points = [p for p in line.points if _finite(p.throughput, p.p50_ms, p.p99_ms)]
        if not points:
            continue
        xs = [p.throughput for p in points]
        axes.plot(xs, [p.p50_ms for p in points], "o-", color=colour, label=f"{line.name} p50")
        axes.plot(
            xs, [p.p99_ms for p in points], "s--", color=colour, alpha=0.7, label=f"{line.name} p99"
        )
        for point in points:
            axes.annotate(
                point.label,
                (point.throughput, point.p99_ms),
                textcoords="offset points",
                xytext=(3, 4),
                fontsize=7,
                color=colour,
            )
    served_max = max(
        (p.throughput for line in series for p in line.points if math.isfinite(p.throughput)),
        default=0.0,
    )
    off_chart = []
    for x, label in references:
        if served_max and x > 2.0 * served_max:
            # A line that far right would squash every served point against the axis.
            off_chart.append(f"{label}: {x:,.0f}/s (off the chart)")
            continue
        if math.isfinite(x) and x > 0:
            axes.axvline(x, color="0.3", linestyle=":", linewidth=1.2)
            axes.annotate(
                label,
                (x, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(-3, -12),
                textcoords="offset points",
                rotation=90,
                ha="right",
                va="top",
                fontsize=7,
                color="0.3",
            )
    axes.set_yscale("log")
    axes.set_xlabel(x_label)
    axes.set_ylabel("latency (ms, log scale)")
    axes.set_title(title, fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    if off_chart:
        axes.text(
            0.99,
            0.02,
            "\n".join(off_chart),
            transform=axes.transAxes,
            ha="right",
            va="bottom",
            fontsize=8,
            color="0.3",
        )
    if series:
        # Outside the axes, so that it never hides a point.
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    if note:
        figure.text(0.01, 0.01, note, fontsize=7, color="0.35")
    figure.tight_layout(rect=(0.0, 0.03 if note else 0.0, 1.0, 1.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(str(path), format="png")


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) and v > 0 for v in values)
