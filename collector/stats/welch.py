"""Welch's t on per-replicate shares, each replicate weighted by its samples, for many
functions at once; and the smallest change such a test detects.

One side's share of a function is pooled: its samples over all the side's samples,
``p = sum(c_i) / sum(N_i)``, the mean of the replicates' shares ``c_i / N_i`` weighted by
their samples ``N_i``. Its variance is measured between replicates, not assumed from the
sample count:

    var(p) = n / (n - 1) * sum((c_i - p * N_i) ** 2) / sum(N_i) ** 2

(the ratio estimator's variance, each replicate a cluster of correlated samples); when every
replicate has the same samples it is exactly ``s**2 / n`` of the replicates' shares, the
variance of Welch's textbook test. The change ``p_B - p_A`` is judged by ``t = change / se``
with ``se = sqrt(var_A + var_B)`` and the Welch-Satterthwaite degrees of freedom
``(var_A + var_B)**2 / (var_A**2 / df_A + var_B**2 / df_B)``, where each side's variances
are first moderated across functions (``moderation``: ``df = n - 1`` without it, more with).

Shares here are fractions (0.05 is 5%). Arrays in, arrays out: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import stdtr, stdtrit

from .moderation import Prior, fit_prior, moderate

__all__ = ["Welch", "minimal_detectable_change", "pooled_share", "welch"]

# Functions with fewer samples than this in a replicate (on average) are left out of the fit
# of a side's prior.
_FIT_SAMPLES = 20


@dataclass(frozen=True, eq=False)
class Welch:
    """Each function's shares, change, standard error, degrees of freedom, two-sided p and
    confidence interval, as arrays of one length (fractions); and each side's prior."""

    a_share: np.ndarray
    b_share: np.ndarray
    change: np.ndarray
    se: np.ndarray
    df: np.ndarray
    p: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    prior: Prior | None  # what the functions say together (None: not moderated)


def pooled_share(counts: np.ndarray, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Returns each column's pooled share over the replicates (rows) and that share's variance
    between replicates (the ratio estimator's; needs two replicates or more)."""
    n = len(samples)
    if n < 2:
        raise ValueError(f"a share's variance between replicates needs 2 of them, got {n}")
    counts = np.asarray(counts, dtype=np.float64)
    weights = np.asarray(samples, dtype=np.float64)
    total = weights.sum()
    share = counts.sum(axis=0) / total
    residuals = counts - np.outer(weights, share)
    variance = n / (n - 1) * np.einsum("ij,ij->j", residuals, residuals) / total**2
    return share, variance


def welch(
    a_counts: np.ndarray,
    a_samples: np.ndarray,
    b_counts: np.ndarray,
    b_samples: np.ndarray,
    confidence: float = 0.95,
    *,
    moderated: bool = True,
) -> Welch:
    """Compares each column of B's replicates with A's: the change of pooled share, its
    standard error between replicates, Welch's two-sided p and the confidence interval.

    Each side's variances are moderated across the columns (``moderation``) unless
    ``moderated`` is false. The binomial variance they are moderated toward is taken at the
    share of both sides together, the share of either under the null hypothesis, so that a
    side whose few replicates happened to miss a rare function is not taken as sure of it.
    A change with no variance on either side (a root frame in every sample of both) has
    p = 1 when it is zero and p = 0 otherwise; its interval is the change itself.
    """
    a_share, a_var = pooled_share(a_counts, a_samples)
    b_share, b_var = pooled_share(b_counts, b_samples)
    na, nb = len(a_samples), len(b_samples)
    a_total, b_total = float(np.sum(a_samples)), float(np.sum(b_samples))
    both = (a_share * a_total + b_share * b_total) / (a_total + b_total)
    a_binomial, b_binomial = both * (1 - both) / a_total, both * (1 - both) / b_total
    # Only functions of many samples a replicate tell the dispersion: a variance of counts
    # near zero is mostly the counts' discreteness.
    # A side of 2 replicates gives each variance 1 degree of freedom, whose logarithm has so
    # long a tail that it would spoil the fit: the other side tells, if it has more.
    a_fit = (both * a_total / na >= _FIT_SAMPLES) & (na > 2 or nb == 2)
    b_fit = (both * b_total / nb >= _FIT_SAMPLES) & (nb > 2 or na == 2)
    prior = (
        fit_prior(
            np.concatenate([a_var[a_fit], b_var[b_fit]]),
            np.concatenate([a_binomial[a_fit], b_binomial[b_fit]]),
            np.repeat([na - 1.0, nb - 1.0], [a_fit.sum(), b_fit.sum()]),
        )
        if moderated
        else None
    )
    a_var, a_df = moderate(a_var, a_binomial, na - 1, prior)
    b_var, b_df = moderate(b_var, b_binomial, nb - 1, prior)
    change = b_share - a_share
    variance = a_var + b_var
    se = np.sqrt(variance)
    spread = a_var**2 / a_df + b_var**2 / b_df
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(spread > 0, variance**2 / np.where(spread > 0, spread, 1), na + nb - 2)
        t = np.where(se > 0, np.abs(change) / np.where(se > 0, se, 1), np.inf)
    p = np.where(se > 0, 2 * stdtr(df, -t), np.where(change == 0, 1.0, 0.0))
    half = stdtrit(df, 0.5 + confidence / 2) * se
    return Welch(a_share, b_share, change, se, df, p, change - half, change + half, prior)


def minimal_detectable_change(
    se: np.ndarray, df: np.ndarray, alpha: float, power: float = 0.8
) -> np.ndarray:
    """Returns the smallest true change a two-sided test at level ``alpha`` finds with
    probability ``power``: ``(t(1 - alpha/2) + t(power)) * se`` at ``df`` degrees of freedom."""
    return (stdtrit(df, 1 - alpha / 2) + stdtrit(df, power)) * se
