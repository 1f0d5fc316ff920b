"""The next idle time from the last few: a small ARIMA(p, 1, 0) fitted by least squares.

The published hybrid histogram policy (Shahrad et al., ATC'20) forecasts the next idle time
with ARIMA for applications whose idle times mostly fall beyond its histogram. This is not
a full ARIMA (no moving-average terms, no maximum likelihood; statsmodels is not a
dependency): the differenced series is fitted with an autoregression of order 0 to
``max_order`` by ordinary least squares in numpy, the order chosen by AIC on a common
sample. That follows a level (order 0: the last value), a trend and a periodic pattern
whose period is at most ``max_order`` (fitted exactly), and costs microseconds. Pure: no
clock, no state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = ["forecast_next"]


def forecast_next(
    series: Sequence[float], *, max_order: int = 4, min_points: int = 5
) -> float | None:
    """The next value of ``series`` (oldest first; positive durations), or None when it
    holds fewer than ``min_points`` values or no finite forecast comes out.

    The forecast is clamped to [min / 2, 2 * max] of the series: a least-squares fit over a
    handful of noisy points may extrapolate far, and a keep-alive plan built on an idle time
    never seen is worth less than one built on the range that was.
    """
    x = np.asarray(series, dtype=np.float64)
    if len(x) < max(min_points, 2) or not bool(np.all(np.isfinite(x))):
        return None
    d: NDArray[np.float64] = np.diff(x).astype(np.float64)
    # At least two equations per coefficient, over a sample common to every order.
    top = max(0, min(max_order, len(d) // 3))
    target = d[top:]
    scale = float(np.var(x)) or 1.0
    best: tuple[float, float] | None = None  # (aic, next difference)
    for p in range(top + 1):
        coef: NDArray[np.float64] = np.zeros(0)
        residual: NDArray[np.float64] = target
        if p > 0:
            lags = np.column_stack([d[top - i : len(d) - i] for i in range(1, p + 1)])
            coef = np.asarray(np.linalg.lstsq(lags, target, rcond=None)[0], dtype=np.float64)
            residual = target - lags @ coef
        # A relative floor keeps exact fits comparable (log 0) and prefers the lowest order.
        rss = float(residual @ residual) / len(target) + 1e-12 * scale
        aic = len(target) * math.log(rss) + 2.0 * p
        step = float(coef @ d[::-1][:p]) if p else 0.0
        if best is None or aic < best[0] - 1e-9:
            best = (aic, step)
    assert best is not None
    predicted = float(x[-1]) + best[1]
    if not math.isfinite(predicted):
        return None
    return float(np.clip(predicted, float(x.min()) / 2.0, 2.0 * float(x.max())))
