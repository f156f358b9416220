"""Change points on synthetic series with a known truth and overdispersion between buckets,
as a fleet's per-minute shares have: a step is found where it is, with its size; a flat series
yields none, at about the nominal rate."""

import numpy as np
import pytest

from collector.stats.changepoints import change_points


def series(rng, shares, samples=2000, dispersion=1000.0):
    """Per-bucket shares: each bucket's true share drawn from a beta around ``shares`` (the
    minute-to-minute wander of a real process), then its samples counted binomially."""
    shares = np.asarray(shares)
    true = rng.beta(shares * dispersion, (1 - shares) * dispersion)
    return rng.binomial(samples, true) / samples


@pytest.mark.parametrize("seed", range(10))
def test_a_step_is_found_at_its_bucket_with_its_size(seed):
    rng = np.random.default_rng(seed)
    truth = np.r_[np.full(70, 0.05), np.full(50, 0.07)]  # +2 points from bucket 70
    points = change_points(series(rng, truth))
    assert len(points) == 1, points
    (point,) = points
    assert abs(point.at - 70) <= 3
    assert point.shift == pytest.approx(0.02, abs=0.006)
    assert point.ci_low < 0.02 < point.ci_high or abs(point.shift - 0.02) < 0.003
    assert point.p < 0.01


def test_a_flat_series_has_no_change_point_at_about_the_nominal_rate():
    rng = np.random.default_rng(2026)
    runs = 200
    false = sum(
        bool(change_points(series(rng, np.full(120, 0.05)), alpha=0.05)) for _ in range(runs)
    )
    # Bonferroni over the splits is conservative: at most the nominal 5% (plus sampling error).
    assert false / runs <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / runs), false


def test_a_test_on_pooled_samples_would_have_found_steps_in_flat_series():
    # Why the buckets are the observations: treating the 2,000 samples of each bucket as
    # independent (a binomial z-test of the two halves) flags most flat, overdispersed series.
    rng = np.random.default_rng(7)
    flagged = 0
    for _ in range(50):
        shares = series(rng, np.full(120, 0.05))
        a, b = shares[:60].mean(), shares[60:].mean()
        pooled = (a + b) / 2
        se = np.sqrt(pooled * (1 - pooled) * (2 / (60 * 2000)))
        flagged += abs(b - a) / se > 1.96
    assert flagged > 10


def test_two_steps_and_bad_input():
    rng = np.random.default_rng(3)
    truth = np.r_[np.full(40, 0.05), np.full(40, 0.08), np.full(40, 0.04)]
    points = change_points(series(rng, truth))
    assert [abs(p.at - at) <= 3 for p, at in zip(points, (40, 80), strict=True)] == [True, True]
    assert points[0].shift > 0 > points[1].shift
    assert change_points([0.1] * 8) == []  # too short to split
    with pytest.raises(ValueError):
        change_points([0.1, float("nan")] * 10)
