"""The statistics against synthetic fleets of known truth, overdispersed between replicates
as real fleets are (bench/synthfleet.py): changes found with their sign and size, intervals
that cover the truth, and A/A comparisons that report a change no more often than the
false discovery rate allows. Each check also runs a test known to be wrong, to show it can
fail."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ndtr
from synthfleet import draw, leaf_with_share, with_change, zipf_truth

from collector.stats import Options, benjamini_hochberg, compare_replicates, welch

TRUTH = zipf_truth(functions=150)
RUNS = 200
FDR = 0.05
# The rate of A/A comparisons reporting any change: FDR, within 3 standard errors of RUNS.
RATE_HIGH = FDR + 3 * math.sqrt(FDR * (1 - FDR) / RUNS)
NO_SPLITS = Options(splits=0)


def aa_rate(a_size, b_size, judge, *, concentration=2000.0, spread=0.0):
    """The share of seeded A/A comparisons in which ``judge`` finds any change."""
    alarms = 0
    for seed in range(RUNS):
        rng = np.random.default_rng(seed)
        a = draw(rng, TRUTH, a_size, concentration=concentration, spread=spread)
        b = draw(rng, TRUTH, b_size, concentration=concentration, spread=spread)
        alarms += judge(a, b)
    return alarms / RUNS


def replicates_judge(a, b):
    return any(f.significant for f in compare_replicates(a, b, NO_SPLITS).findings)


def samples_judge(a, b):
    """Samples treated as independent: a two-proportion z-test on the pooled counts."""
    a_counts, b_counts = a.self_counts.sum(axis=0), b.self_counts.sum(axis=0)
    a_total, b_total = a.samples.sum(), b.samples.sum()
    keep = a_counts + b_counts >= 30
    both = (a_counts + b_counts)[keep] / (a_total + b_total)
    se = np.sqrt(both * (1 - both) * (1 / a_total + 1 / b_total))
    z = np.abs(b_counts[keep] / b_total - a_counts[keep] / a_total) / se
    return bool((benjamini_hochberg(2 * ndtr(-z)) <= FDR).any())


def unmoderated_judge(a, b):
    """Plain Welch: each function's variance from its own replicates only."""
    leaves = len(TRUTH.leaves)
    test = welch(
        a.self_counts[:, :leaves],
        a.samples,
        b.self_counts[:, :leaves],
        b.samples,
        moderated=False,
    )
    judged = (a.self_counts[:, :leaves].sum(0) + b.self_counts[:, :leaves].sum(0)) >= 30
    return bool((benjamini_hochberg(test.p[judged]) <= FDR).any())


@pytest.mark.parametrize("seed", range(20))
def test_a_one_point_growth_is_found_with_its_sign_and_size(seed):
    leaf = leaf_with_share(TRUTH, 2.0)
    grown = with_change(TRUTH, leaf, 1.0)
    rng = np.random.default_rng(seed)
    comparison = compare_replicates(draw(rng, TRUTH, 40), draw(rng, grown, 40), NO_SPLITS)
    name = TRUTH.leaves[leaf]
    finding = next(f for f in comparison.findings if (f.function, f.kind) == (name, "self"))
    assert finding.significant and finding.change > 0
    assert abs(finding.change - 1.0) < 0.3
    assert comparison.regressions(0.5)[0].function == name


def test_intervals_cover_the_truth_at_their_level():
    leaf = leaf_with_share(TRUTH, 5.0)
    grown = with_change(TRUTH, leaf, 1.0)
    covered = 0
    for seed in range(RUNS):
        rng = np.random.default_rng(seed)
        comparison = compare_replicates(draw(rng, TRUTH, 8), draw(rng, grown, 12), NO_SPLITS)
        f = next(f for f in comparison.findings if f.function == TRUTH.leaves[leaf])
        covered += f.ci_low <= 1.0 <= f.ci_high
    se = math.sqrt(0.95 * 0.05 / RUNS)
    assert 0.95 - 3 * se <= covered / RUNS <= 0.95 + 3 * se


@pytest.mark.parametrize(
    "a_size, b_size, concentration, spread",
    [
        (10, 10, 2000.0, 0.5),  # replicates of uneven sizes
        (3, 3, 2000.0, 0.0),
        (3, 20, 2000.0, 0.0),
        (2, 30, 2000.0, 0.0),
        (30, 30, 200.0, 0.0),  # replicates varying 30 times more than sample counting
        (10, 10, math.inf, 0.0),  # no overdispersion: samples as good as independent
    ],
)
def test_aa_comparisons_report_a_change_at_the_nominal_rate(a_size, b_size, concentration, spread):
    rate = aa_rate(a_size, b_size, replicates_judge, concentration=concentration, spread=spread)
    assert rate <= RATE_HIGH


def test_aa_rate_is_near_the_false_discovery_rate_not_just_below_it():
    """Not so cautious that it could never find anything: about 5% over the balanced fleets."""
    rate = aa_rate(20, 20, replicates_judge, spread=0.3)
    assert FDR - 3 * math.sqrt(FDR * (1 - FDR) / RUNS) <= rate <= RATE_HIGH


def test_samples_treated_as_independent_fail_on_overdispersed_fleets():
    assert aa_rate(10, 10, samples_judge) > 0.9
    # ... and are right where there is no overdispersion: the check itself is sound.
    assert aa_rate(10, 10, samples_judge, concentration=math.inf) <= RATE_HIGH


def test_unmoderated_welch_fails_with_few_replicates_against_many():
    assert aa_rate(3, 20, unmoderated_judge) > 0.5
