"""The statistics module piece by piece: replicates from folded profiles, the weighted Welch
test against scipy's, Benjamini-Hochberg against scipy's, the moderation's prior, the
minimal detectable change, and how a comparison lists, judges and ranks its findings."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.stats
from synthfleet import draw, leaf_with_share, profiles, with_change, zipf_truth

from collector.functions import FunctionSamples
from collector.stats import (
    SETTINGS,
    ComparisonError,
    Options,
    benjamini_hochberg,
    compare,
    compare_replicates,
    fit_prior,
    minimal_detectable_change,
    moderate,
    pooled_share,
    replicates_of,
    welch,
)
from sampler.settings import SettingsError

TRUTH = zipf_truth(functions=150)


def test_replicates_count_self_and_total_once_per_stack_and_leave_out_empty_profiles():
    a, b = replicates_of(
        [{"main;f;g": 3, "main;f;f;f": 2, "main": 1}, {}],
        [{"main;h": 4, "other;g": 1}],
    )
    assert a.functions == b.functions == ("f", "g", "h", "main", "other")
    assert a.size == 1 and b.size == 1  # the empty profile is no replicate
    assert a.self_counts.tolist() == [[2, 3, 0, 1, 0]]
    assert a.total_counts.tolist() == [[5, 3, 0, 6, 0]]  # f counts once in f;f;f
    assert b.total_counts.tolist() == [[0, 1, 4, 4, 1]]
    assert a.samples.tolist() == [6] and b.samples.tolist() == [5]


def test_replicates_by_any_key_count_as_functions_of_each_profile_does():
    # Random profiles with recursion, empty frames and the empty stack, keyed by stack ids:
    # every row must be what collector.functions counts of that profile alone.
    rng = np.random.default_rng(3)
    names = ["main", "f", "g", "h", ""]
    pool = [";".join(rng.choice(names, size=rng.integers(1, 7))) for _ in range(60)] + [""]
    ids = {stack: 1000 + i for i, stack in enumerate(dict.fromkeys(pool))}
    text = {i: stack for stack, i in ids.items()}
    sides = [
        [
            {ids[stack]: int(rng.integers(-1, 9)) for stack in rng.choice(pool, size=20)}
            for _ in range(5)
        ]
        for _ in range(2)
    ]
    replicates = replicates_of(*sides, frames=lambda i: text[i].split(";"))
    for side, got in zip(sides, replicates, strict=True):
        row = 0
        for profile in side:
            folded = {text[i]: c for i, c in profile.items()}
            expected = FunctionSamples.of(folded)
            if expected.total == 0:
                continue
            column = {name: j for j, name in enumerate(got.functions)}
            assert got.samples[row] == expected.total
            for name, j in column.items():
                assert got.self_counts[row, j] == expected.self_counts.get(name, 0), name
                assert got.total_counts[row, j] == expected.totals.get(name, 0), name
            row += 1
        assert row == got.size


def test_pooled_share_is_samples_over_samples_and_its_variance_between_replicates():
    counts = np.array([[10], [30], [20]])
    share, variance = pooled_share(counts, np.array([100, 100, 100]))
    assert share[0] == pytest.approx(0.2)
    # Equal replicates: exactly the variance of the mean of their shares, s**2 / n.
    assert variance[0] == pytest.approx(np.var([0.1, 0.3, 0.2], ddof=1) / 3)
    share, variance = pooled_share(np.array([[10], [60]]), np.array([100, 300]))
    assert share[0] == pytest.approx(70 / 400)
    residuals = np.array([10 - 100 * 70 / 400, 60 - 300 * 70 / 400])
    assert variance[0] == pytest.approx(2 * (residuals**2).sum() / 400**2)
    with pytest.raises(ValueError, match="needs 2"):
        pooled_share(np.array([[1]]), np.array([10]))


def test_unmoderated_welch_of_equal_replicates_is_scipys_welch():
    rng = np.random.default_rng(1)
    a_counts, b_counts = rng.integers(50, 150, (6, 4)), rng.integers(60, 160, (9, 4))
    test = welch(a_counts, np.full(6, 1000), b_counts, np.full(9, 1000), moderated=False)
    for column in range(4):
        reference = scipy.stats.ttest_ind(
            b_counts[:, column] / 1000, a_counts[:, column] / 1000, equal_var=False
        )
        assert test.p[column] == pytest.approx(reference.pvalue, rel=1e-9)
        interval = reference.confidence_interval(0.95)
        assert test.ci_low[column] == pytest.approx(interval.low, rel=1e-9)
        assert test.ci_high[column] == pytest.approx(interval.high, rel=1e-9)


def test_no_variance_on_either_side():
    counts = np.array([[100], [100]])
    test = welch(counts, np.array([100, 100]), counts, np.array([100, 100]))
    assert test.p[0] == 1.0 and test.ci_low[0] == test.ci_high[0] == 0.0
    test = welch(np.zeros((2, 1)), np.array([100, 100]), counts, np.array([100, 100]))
    assert test.p[0] == 0.0


def test_benjamini_hochberg_is_scipys():
    p = np.random.default_rng(2).random(300) ** 3
    assert benjamini_hochberg(p) == pytest.approx(scipy.stats.false_discovery_control(p))
    assert benjamini_hochberg(np.array([])).size == 0


def test_the_prior_recovers_a_known_dispersion_and_moderates_toward_it():
    rng = np.random.default_rng(3)
    binomial = rng.uniform(1e-6, 1e-4, 2000)
    # Variances of 4 degrees of freedom around 3.5 times the binomial ones, all alike.
    variance = 3.5 * binomial * rng.chisquare(4, 2000) / 4
    prior = fit_prior(variance, binomial, np.full(2000, 4.0))
    assert prior.dispersion == pytest.approx(3.5, rel=0.05)
    assert prior.df > 50  # every function agrees: the prior is worth much
    moderated, df = moderate(variance, binomial, 4, prior)
    assert np.std(moderated / binomial) < 0.1 * np.std(variance / binomial)
    assert np.all(df > 50)
    # Functions that disagree (dispersions spread over a factor of 100) keep their own.
    spread = variance * np.exp(rng.normal(0, 2, 2000))
    assert fit_prior(spread, binomial, np.full(2000, 4.0)).df < 2
    assert fit_prior(variance[:2], binomial[:2], np.full(2, 4.0)) is None


def test_a_change_of_the_minimal_detectable_size_is_found_about_as_often_as_promised():
    """80% power at the comparison's own alpha: the MDE is neither a boast nor too timid."""
    leaf = leaf_with_share(TRUTH, 3.0)
    rng = np.random.default_rng(4)
    mde = compare_replicates(draw(rng, TRUTH, 20), draw(rng, TRUTH, 20), Options(splits=0))
    size = next(f.mde for f in mde.findings if f.function == TRUTH.leaves[leaf])
    grown = with_change(TRUTH, leaf, size)
    found = 0
    for seed in range(100):
        rng = np.random.default_rng(100 + seed)
        comparison = compare_replicates(
            draw(rng, TRUTH, 20), draw(rng, grown, 20), Options(splits=0)
        )
        found += next(
            f.significant for f in comparison.findings if f.function == grown.leaves[leaf]
        )
    assert 0.65 <= found / 100 <= 0.95  # 0.8, within sampling error of 100 runs


def test_minimal_detectable_change_formula():
    se, df = np.array([0.001]), np.array([1e6])
    assert minimal_detectable_change(se, df, 0.05, 0.8)[0] == pytest.approx(
        (1.959964 + 0.841621) * 0.001, rel=1e-5
    )


def test_compare_lists_judges_and_ranks():
    leaf = leaf_with_share(TRUTH, 2.0)
    grown = with_change(TRUTH, leaf, 1.5)
    rng = np.random.default_rng(5)
    a = profiles(TRUTH, draw(rng, TRUTH, 12))
    b = profiles(grown, draw(rng, grown, 12))
    a.append({})  # an empty profile is left out
    b[0]["app:main;app.mod0:handle;app.new:function"] = 400
    comparison = compare(a, b)
    assert (comparison.a_replicates, comparison.b_replicates) == (12, 12)
    kinds = {(f.function, f.kind) for f in comparison.findings}
    # A leaf is judged once, as self; callers have no self share to judge; the root's total
    # is 100% on both sides.
    assert (TRUTH.leaves[leaf], "total") not in kinds
    assert ("app.mod0:handle", "self") not in kinds and ("app.mod0:handle", "total") in kinds
    root = next(f for f in comparison.findings if f.function == "app:main")
    assert root.judged and root.p == 1.0 and not root.significant
    # Ranked: judged ones by q first, the unjudged after them with no statistics.
    top = comparison.findings[0]
    assert (top.function, top.kind, top.significant) == (TRUTH.leaves[leaf], "self", True)
    judged = [f for f in comparison.findings if f.judged]
    assert [f.q for f in judged] == sorted(f.q for f in judged)
    rare = [f for f in comparison.findings if not f.judged]
    assert rare and comparison.findings[-len(rare) :] == tuple(rare)
    # In one replicate only: not judged, however many samples.
    new = next(f for f in comparison.findings if f.function == "app.new:function")
    assert not new.judged and new.replicates == 1 and new.b_samples == 400
    assert (new.p, new.q, new.ci_low, new.mde, new.significant) == (None, None, None, None, False)
    assert comparison.judged == len(judged)


def test_a_new_function_in_every_replicate_of_b_is_found():
    a = [{"main;work": 1000 + i} for i in range(4)]
    b = [{"main;work": 900 + i, "main;new": 100 - i} for i in range(4)]
    finding = next(f for f in compare(a, b).findings if f.function == "new")
    assert finding.judged and finding.significant and finding.a_share == 0.0
    assert finding.change == pytest.approx(100 * 394 / 4000)


def test_folded_profiles_and_count_matrices_give_the_same_comparison():
    rng = np.random.default_rng(6)
    a, b = draw(rng, TRUTH, 5), draw(rng, TRUTH, 6)
    from_arrays = compare_replicates(a, b)
    from_folded = compare(profiles(TRUTH, a), profiles(TRUTH, b))
    # The same up to rounding: the functions' columns come in another order.
    assert same(from_arrays.noise_floor, from_folded.noise_floor)
    by_name = {(f.function, f.kind): f for f in from_folded.findings}
    assert len(by_name) == len(from_arrays.findings)
    for finding in from_arrays.findings:
        assert same(finding, by_name[finding.function, finding.kind])


def same(x, y):
    """Whether two dataclasses hold the same values, floats to 1e-9."""
    for field in dataclasses.fields(x):
        a, b = getattr(x, field.name), getattr(y, field.name)
        if isinstance(a, float) and isinstance(b, float):
            if a != pytest.approx(b, rel=1e-9, abs=1e-12):
                return False
        elif a != b:
            return False
    return True


def test_noise_floor():
    rng = np.random.default_rng(7)
    a, b = draw(rng, TRUTH, 10), draw(rng, TRUTH, 10)
    floor = compare_replicates(a, b, Options(splits=30, seed=1)).noise_floor
    assert floor.splits == 30 and floor.significant_splits <= 5
    assert 0 < floor.largest_change < 2 and 0 < floor.mde < floor.largest_change
    assert floor.dispersion == pytest.approx(4.0, rel=0.2)  # 1 + 6000 / 2001
    assert floor.alpha == pytest.approx(0.05 / compare_replicates(a, b).judged)
    assert compare_replicates(a, b, Options(splits=30, seed=1)).noise_floor == floor
    assert compare_replicates(a, b, Options(splits=30, seed=2)).noise_floor != floor
    none = compare_replicates(a, b, Options(splits=0)).noise_floor
    assert (none.splits, none.largest_change, none.significant_splits) == (0, None, 0)


def test_the_detectable_change_leaves_out_shares_that_never_vary():
    # The root's total is 100% in every replicate: its own detectable change is 0, which says
    # nothing (no variation to measure against) and pulled the median down (0.00 points for
    # two runs of a program whose stacks are mostly one chain).
    rng = np.random.default_rng(7)
    comparison = compare_replicates(draw(rng, TRUTH, 10), draw(rng, TRUTH, 10))
    judged = [f.mde for f in comparison.findings if f.judged]
    assert 0.0 in judged
    varying = [f.mde for f in comparison.findings if f.judged and f.mde > 0 and f.kind == "self"]
    assert comparison.noise_floor.mde == pytest.approx(float(np.median(varying)))
    assert comparison.noise_floor.mde_functions == len(varying)


def test_the_detectable_change_is_the_self_shares_not_two_kinds_of_workers_start_up():
    # A fleet of two kinds of worker (gunicorn sync and gthread in the demo): each kind's own
    # start-up frames hold ~100% of its replicates' totals and 0% of the other's, so the
    # totals' detectable changes are ~100 points, and their median read 98 points beside a
    # significant change of 21. The self shares say what the comparison can detect.
    rng = np.random.default_rng(9)

    def replicates(count):
        profiles = []
        for i in range(count):
            kind = "sync" if i % 2 else "gthread"
            root = ";".join(f"{kind}:start{depth}" for depth in range(6))  # start-up frames
            leaves = {"app:render": 700, "app:query": 200, "json:dumps": 100}
            profiles.append(
                {f"{root};{leaf}": int(n + rng.integers(-30, 30)) for leaf, n in leaves.items()}
            )
        return profiles

    floor = compare(replicates(12), replicates(12)).noise_floor
    assert floor.mde is not None and floor.mde < 20, floor
    assert floor.mde_high is not None and floor.mde_high < 20, floor


def test_regressions_are_significant_rises_above_the_threshold():
    leaf = leaf_with_share(TRUTH, 2.0)
    grown = with_change(TRUTH, leaf, 3.0)
    rng = np.random.default_rng(8)
    comparison = compare_replicates(draw(rng, TRUTH, 10), draw(rng, grown, 10))
    names = {(f.function, f.kind) for f in comparison.regressions()}  # above 2 points
    assert names == {(TRUTH.leaves[leaf], "self"), (TRUTH.callers[leaf], "total")}
    assert comparison.regressions(5.0) == []
    # A fall is no regression, however significant.
    fall = compare_replicates(draw(rng, grown, 10), draw(rng, TRUTH, 10))
    assert fall.findings[0].significant and fall.findings[0].change < -2
    assert all(f.change > 0 for f in fall.regressions(0))


def test_a_side_needs_two_replicates_with_samples():
    with pytest.raises(ComparisonError, match="side B has 1 profile"):
        compare([{"a": 1}, {"a": 2}], [{"a": 3}, {}])


def test_options_are_the_settings_and_are_checked():
    assert [f.name for f in dataclasses.fields(Options)] == [s.name for s in SETTINGS]
    assert all(getattr(Options(), s.name) == s.default for s in SETTINGS)
    for bad in ({"fdr": 1.0}, {"confidence": 0}, {"min_replicates": 0}, {"fail_above": -1}):
        with pytest.raises(SettingsError):
            Options(**bad)
