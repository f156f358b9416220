"""Benjamini-Hochberg: q-values controlling the false discovery rate over many tests."""

from __future__ import annotations

import numpy as np

__all__ = ["benjamini_hochberg"]


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Returns the q-value of each p-value: the smallest false discovery rate at which
    Benjamini-Hochberg's step-up procedure rejects it (``min over k >= rank of p_(k) m / k``).

    Rejecting every test with ``q <= alpha`` keeps the expected share of false discoveries
    among the rejections at or below ``alpha`` for independent or positively dependent tests.
    """
    p = np.asarray(p, dtype=np.float64)
    m = len(p)
    if m == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    scaled = p[order] * m / np.arange(1, m + 1)
    q_sorted = np.minimum.accumulate(scaled[::-1])[::-1]
    q = np.empty(m)
    q[order] = np.minimum(q_sorted, 1.0)
    return q
