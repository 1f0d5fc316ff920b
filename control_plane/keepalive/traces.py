"""Traffic traces for the simulator: per model, its busy periods.

Two formats:

* ServeGen (Alibaba, Apache-2.0): one CSV per client, a row per 600 s window,
  ``window_start_s, rate_req_s, IAT_CV, family, shape, scale``. Each window's arrivals are
  drawn from its fitted Gamma or Weibull inter-arrival distribution, ``rate * 600`` of them,
  scaled to fill the window, with a seeded generator.
* A plain ``timestamp,model`` CSV (a header line is optional; timestamps in seconds or
  ISO 8601), such as a platform's access log.

Each request holds a replica for ``hold_s``, so a model is busy over the union of
``[arrival, arrival + hold_s]``; what a keep-alive policy sees are the gaps between those
busy periods. Only inter-arrival times longer than ``hold_s`` make a gap, which keeps a
dense window cheap: there the few long inter-arrival times are drawn from the tail of the
distribution (their number binomial, their places uniform among the window's slots) and
the short ones, which only keep the replica busy, are spread evenly between them. Windows
of at most ``exact_max`` requests are drawn arrival by arrival.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "ModelTrace",
    "bursts",
    "read_plain_csv",
    "read_servegen",
    "servegen_files",
    "servegen_points",
]

WINDOW_S = 600.0
"""ServeGen's window length."""


@dataclass(frozen=True, slots=True)
class ModelTrace:
    """One model's traffic as busy periods (sorted, separated by idle gaps)."""

    name: str
    start: NDArray[np.float64]
    """First arrival of each busy period (seconds from the trace's start)."""
    last: NDArray[np.float64]
    """Last arrival of each busy period; the replica is busy until ``last + hold_s``."""
    count: NDArray[np.int64]
    """Requests in each busy period."""
    hold_s: float
    horizon_s: float
    """Length of the trace: the always-on replica is held this long."""

    @property
    def requests(self) -> int:
        return int(self.count.sum())

    @property
    def busy_s(self) -> float:
        """Replica-seconds serving (the union of the requests' hold times)."""
        return float(np.sum(np.minimum(self.last + self.hold_s, self.horizon_s) - self.start))


def bursts(
    name: str,
    times: NDArray[np.float64],
    counts: NDArray[np.int64],
    *,
    hold_s: float,
    horizon_s: float,
) -> ModelTrace:
    """Group sorted arrival points (``counts[i]`` requests up to ``times[i]``, each point
    within ``hold_s`` of the previous one when they belong together) into busy periods."""
    if len(times) == 0:
        empty = np.zeros(0)
        return ModelTrace(name, empty, empty, np.zeros(0, np.int64), hold_s, horizon_s)
    breaks = np.flatnonzero(np.diff(times) > hold_s) + 1
    first = np.concatenate(([0], breaks))
    last = np.concatenate((breaks - 1, [len(times) - 1]))
    totals = np.add.reduceat(counts, first)
    return ModelTrace(
        name=name,
        start=times[first].astype(np.float64),
        last=times[last].astype(np.float64),
        count=totals.astype(np.int64),
        hold_s=hold_s,
        horizon_s=horizon_s,
    )


def read_plain_csv(path: Path, *, hold_s: float) -> list[ModelTrace]:
    """Models of a ``timestamp,model`` CSV, timed from its earliest request."""
    stamps: dict[str, list[float]] = {}
    with path.open(newline="") as f:
        for row in csv.reader(f):
            if len(row) < 2 or not row[0].strip() or row[0].strip().startswith("#"):
                continue
            try:
                at = _timestamp(row[0].strip())
            except ValueError:
                if not stamps:
                    continue  # a header line
                raise ValueError(f"{path}: bad timestamp {row[0]!r}") from None
            stamps.setdefault(row[1].strip(), []).append(at)
    if not stamps:
        raise ValueError(f"{path}: no requests")
    origin = min(min(v) for v in stamps.values())
    end = max(max(v) for v in stamps.values()) - origin + hold_s
    traces = []
    for name in sorted(stamps):
        times = np.sort(np.asarray(stamps[name]) - origin)
        traces.append(
            bursts(name, times, np.ones(len(times), np.int64), hold_s=hold_s, horizon_s=end)
        )
    return traces


def read_servegen(
    paths: Sequence[Path], *, hold_s: float, seed: int = 0, exact_max: int = 256
) -> list[ModelTrace]:
    """One model per ServeGen client file, arrivals drawn with ``seed`` (client i uses the
    stream ``seed, i`` so a subset of files replays the same)."""
    traces = []
    for index, path in enumerate(paths):
        rows = _servegen_rows(path)
        horizon = float(rows[:, 0].max()) + WINDOW_S if len(rows) else 0.0
        rng = np.random.default_rng([seed, index])
        times, counts = servegen_points(rows, rng, hold_s=hold_s, exact_max=exact_max)
        traces.append(bursts(path.stem, times, counts, hold_s=hold_s, horizon_s=horizon))
    return traces


def servegen_points(
    rows: NDArray[np.float64],
    rng: np.random.Generator,
    *,
    hold_s: float,
    exact_max: int = 256,
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Arrival points of one client: rows of (window start, rate, family code (0 Gamma,
    1 Weibull), shape, scale). Returns sorted times and the requests each point stands for."""
    n = np.rint(rows[:, 1] * WINDOW_S).astype(np.int64)
    busy = n > 0
    exact = busy & (n <= exact_max)
    parts_t: list[NDArray[np.float64]] = []
    parts_c: list[NDArray[np.int64]] = []
    exact_t = _exact_arrivals(rows[exact], n[exact], rng)
    dense_rows = np.flatnonzero(busy & ~exact)
    dense: dict[int, tuple[NDArray[np.float64], NDArray[np.int64]]] = {
        int(i): _dense_points(rows[i], int(n[i]), rng, hold_s) for i in dense_rows
    }
    # Windows are disjoint and in order: merge by window.
    exact_bounds = np.concatenate(([0], np.cumsum(n[exact])))
    cursor = 0
    for i in np.flatnonzero(busy):
        if exact[i]:
            lo, hi = exact_bounds[cursor], exact_bounds[cursor + 1]
            cursor += 1
            parts_t.append(exact_t[lo:hi])
            parts_c.append(np.ones(hi - lo, np.int64))
        else:
            t, c = dense[int(i)]
            parts_t.append(t)
            parts_c.append(c)
    if not parts_t:
        return np.zeros(0), np.zeros(0, np.int64)
    return np.concatenate(parts_t), np.concatenate(parts_c)


def _exact_arrivals(
    rows: NDArray[np.float64], n: NDArray[np.int64], rng: np.random.Generator
) -> NDArray[np.float64]:
    """All windows' arrivals at once: n + 1 draws per window (the last is the time from the
    last arrival to the window's end), scaled so each window's draws sum to its length."""
    if len(rows) == 0:
        return np.zeros(0)
    slots = n + 1
    shape = np.repeat(_shape(rows), slots)
    scale = np.repeat(_scale(rows), slots)
    weibull = np.repeat(rows[:, 2] == 1, slots)
    draws = np.empty(len(shape))
    draws[~weibull] = rng.gamma(shape[~weibull], scale[~weibull])
    draws[weibull] = scale[weibull] * rng.weibull(shape[weibull])
    draws = np.maximum(draws, 1e-12)
    ends = np.cumsum(slots)
    starts = ends - slots
    totals = np.add.reduceat(draws, starts)
    within = np.cumsum(draws) - np.repeat(np.cumsum(totals) - totals, slots)
    times = np.repeat(rows[:, 0], slots) + within * np.repeat(WINDOW_S / totals, slots)
    last_slot = np.zeros(len(draws), bool)
    last_slot[ends - 1] = True
    return np.asarray(times[~last_slot], dtype=np.float64)


def _dense_points(
    row: NDArray[np.float64], n: int, rng: np.random.Generator, hold_s: float
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """A dense window as points: the first and last arrival of each run of inter-arrival
    times below ``hold_s``."""
    # Only the ServeGen sampler needs scipy (the incomplete gamma function).
    from scipy import special  # type: ignore[import-untyped]

    start, _, family, _, _ = row
    shape, scale = float(_shape(row[None])[0]), float(_scale(row[None])[0])
    slots = n + 1
    if family == 1:
        mean = scale * math.gamma(1.0 + 1.0 / shape)
    else:
        mean = shape * scale
    stretch = WINDOW_S / (slots * mean)
    threshold = hold_s / stretch
    if family == 1:
        tail = math.exp(-((threshold / scale) ** shape))
    else:
        tail = float(special.gammaincc(shape, threshold / scale))
    m = int(rng.binomial(slots, tail)) if tail > 0 else 0
    if m:
        v = rng.uniform(0.0, tail, m)
        if family == 1:
            long = scale * (-np.log(np.maximum(v, 1e-300))) ** (1.0 / shape)
        else:
            long = scale * special.gammainccinv(shape, v)
        long = np.maximum(long * stretch, hold_s)
        if long.sum() > 0.99 * WINDOW_S:
            long *= 0.99 * WINDOW_S / long.sum()
        where = np.sort(rng.choice(slots, m, replace=False))
    else:
        long = np.zeros(0)
        where = np.zeros(0, np.int64)
    short = (WINDOW_S - long.sum()) / (slots - m)
    # Slot i precedes arrival i + 1; slot n follows the last arrival. A long slot between
    # arrivals i and i + 1 (1 <= i < n) ends one busy run and starts the next.
    inner = (where >= 1) & (where <= n - 1)
    cuts = where[inner]
    firsts = np.concatenate(([1], cuts + 1))
    lasts = np.concatenate((cuts, [n]))
    offset = np.concatenate(([0.0], np.cumsum(long)))

    def at(j: NDArray[np.int64]) -> NDArray[np.float64]:
        before = np.searchsorted(where, j, side="left")  # long slots among 0 .. j - 1
        return np.asarray(start + short * (j - before) + offset[before], dtype=np.float64)

    t_first, t_last = at(firsts), at(lasts)
    sizes = lasts - firsts + 1
    times = np.empty(2 * len(firsts))
    counts = np.empty(2 * len(firsts), np.int64)
    times[0::2], times[1::2] = t_first, t_last
    counts[0::2], counts[1::2] = 1, sizes - 1
    keep = counts > 0
    keep[0::2] = True
    return times[keep], counts[keep]


def _shape(rows: NDArray[np.float64]) -> NDArray[np.float64]:
    # A window with no usable fit is treated as Poisson arrivals.
    shape = rows[:, 3]
    return np.where(np.isfinite(shape) & (shape > 0), shape, 1.0)


def _scale(rows: NDArray[np.float64]) -> NDArray[np.float64]:
    scale = rows[:, 4]
    return np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)


def _servegen_rows(path: Path) -> NDArray[np.float64]:
    out: list[tuple[float, float, float, float, float]] = []
    with path.open(newline="") as f:
        for row in csv.reader(f):
            if not row or not row[0].strip():
                continue
            try:
                start, rate = float(row[0]), float(row[1])
            except ValueError:
                continue  # a header line
            family = 1.0 if len(row) > 3 and row[3].strip().lower() == "weibull" else 0.0
            shape = _float(row[4]) if len(row) > 4 else math.nan
            scale = _float(row[5]) if len(row) > 5 else math.nan
            out.append((start, rate, family, shape, scale))
    out.sort()
    return np.asarray(out, dtype=np.float64).reshape(-1, 5)


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _timestamp(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text).timestamp()


def servegen_files(folder: Path) -> list[Path]:
    """A ServeGen folder's ``chunk-N-trace.csv`` files in client order."""
    files = list(folder.glob("*-trace.csv"))

    def key(p: Path) -> tuple[int, str]:
        digits = "".join(ch for ch in p.stem if ch.isdigit())
        return (int(digits) if digits else -1, p.name)

    return sorted(files, key=key)
