"""When did it start: change points in a function's share over time (issue 15).

Binary segmentation on per-bucket shares. In a segment of buckets, every split leaving at least
``min_size`` buckets a side is scored by the difference of the mean shares before and after it
over its standard error (CUSUM), the noise of one bucket estimated from successive differences
(robust to the step itself); the best split is a change point when its p-value, multiplied by
the number of splits tried (Bonferroni: the best of many splits is not one test), is under
``alpha``; each side is then searched the same way. The observations are the per-bucket shares, not the samples: a
function's share moves from minute to minute by more than sample counting explains
(overdispersion, see collector/stats/__init__.py), and a test on pooled samples would find
steps in a flat series. Each change point reports the mean share before and after it (over the
segments it separates), the shift, its confidence interval and its adjusted p-value.

Pure: numbers in, numbers out; numpy and scipy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, stdtr, stdtrit  # not scipy.stats: ~0.4 s to import

__all__ = ["ChangePoint", "change_points"]


@dataclass(frozen=True)
class ChangePoint:
    """A shift in a series: at index ``at`` (the first bucket after it)."""

    at: int
    before: float  # mean share of the segment before
    after: float  # mean share of the segment after
    shift: float  # after - before
    ci_low: float  # the shift's confidence interval (1 - alpha)
    ci_high: float
    p: float  # adjusted for the splits tried

    def to_dict(self) -> dict[str, float | int]:
        return {
            "at": self.at,
            "before": self.before,
            "after": self.after,
            "shift": self.shift,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "p": self.p,
        }


def change_points(
    shares: np.ndarray | list[float],
    *,
    alpha: float = 0.01,
    min_size: int = 5,
    max_points: int = 5,
) -> list[ChangePoint]:
    """Returns the change points of a series of per-bucket shares, in time order."""
    values = np.asarray(shares, dtype=float)
    if values.ndim != 1 or not np.all(np.isfinite(values)):
        raise ValueError("shares must be a flat series of finite numbers")
    if not 0 < alpha < 1 or min_size < 2:
        raise ValueError("alpha must be in (0, 1) and min_size at least 2")
    found: list[int] = []
    segments = [(0, len(values))]
    while segments and len(found) < max_points:
        lo, hi = segments.pop()
        split = _best_split(values, lo, hi, alpha, min_size)
        if split is not None:
            found.append(split)
            segments += [(lo, split), (split, hi)]
    found.sort()
    edges = [0, *found, len(values)]
    points = []
    for i, at in enumerate(found):
        before, after = values[edges[i] : at], values[at : edges[i + 2]]
        tests = max(1, (edges[i + 2] - edges[i]) - 2 * min_size + 1)
        points.append(_describe(at, before, after, alpha, tests))
    return points


def _best_split(values: np.ndarray, lo: int, hi: int, alpha: float, min_size: int) -> int | None:
    segment = values[lo:hi]
    n = len(segment)
    if n < 2 * min_size:
        return None
    # The noise of one bucket, from successive differences (a step barely moves it), robustly.
    sigma = float(np.median(np.abs(np.diff(segment)))) / (0.6745 * np.sqrt(2))
    if sigma == 0.0:
        sigma = float(segment.std(ddof=1))
    if sigma == 0.0:
        return None
    cumulative = np.cumsum(segment)
    total = cumulative[-1]
    k = np.arange(min_size, n - min_size + 1)
    left = cumulative[k - 1] / k
    right = (total - cumulative[k - 1]) / (n - k)
    z = np.abs(right - left) / (sigma * np.sqrt(1 / k + 1 / (n - k)))
    best = int(np.argmax(z))
    p = float(2 * ndtr(-z[best]))
    return lo + int(k[best]) if p * len(k) < alpha else None


def _welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """The shift of b's mean over a's, its standard error and Welch's two-sided p-value."""
    shift = float(b.mean() - a.mean())
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = float(np.sqrt(va + vb))
    if se == 0.0:
        return shift, 0.0, 0.0 if shift else 1.0
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return shift, se, float(2 * stdtr(df, -abs(shift) / se))


def _describe(
    at: int, before: np.ndarray, after: np.ndarray, alpha: float, tests: int
) -> ChangePoint:
    shift, se, p = _welch(before, after)
    va, vb = before.var(ddof=1) / len(before), after.var(ddof=1) / len(after)
    df = (va + vb) ** 2 / (va**2 / (len(before) - 1) + vb**2 / (len(after) - 1)) if se else 1.0
    half = float(stdtrit(df, 1 - alpha / 2)) * se if se else 0.0
    return ChangePoint(
        at=at,
        before=float(before.mean()),
        after=float(after.mean()),
        shift=shift,
        ci_low=shift - half,
        ci_high=shift + half,
        p=min(1.0, p * tests),
    )
