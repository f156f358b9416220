"""bench/accuracy_stats.py: standard errors, the A/A noise, the criteria and the verdict."""

from __future__ import annotations

import math

import accuracy_compare
import accuracy_stats
import pytest
from accuracy_compare import Comparison, Profile, Row, Share
from accuracy_stats import BY_AA, BY_SE, GOAL, MISS, Judged, Judgement, Noise


def test_standard_error_of_a_share_and_of_a_difference():
    assert accuracy_stats.share_se(50.0, 2500) == pytest.approx(1.0)
    assert accuracy_stats.share_se(10.0, 900) == pytest.approx(1.0)
    assert accuracy_stats.share_se(0.0, 100) == 0.0
    assert accuracy_stats.share_se(100.0, 100) == 0.0
    assert accuracy_stats.difference_se(50.0, 2500, 50.0, 2500) == pytest.approx(math.sqrt(2))
    # 20 * 80 / 400 = 4, 10 * 90 / 900 = 1
    assert accuracy_stats.difference_se(20.0, 400, 10.0, 900) == pytest.approx(math.sqrt(5))


def test_a_share_of_no_samples_has_no_standard_error():
    with pytest.raises(ValueError, match="no samples"):
        accuracy_stats.share_se(0.0, 0)


@pytest.mark.parametrize(
    ("diff", "se", "floor", "met"),
    [
        (3.0, 0.1, None, GOAL),
        (-3.0, 0.1, None, GOAL),
        (-4.0, 2.0, None, BY_SE),  # 4 <= 2.5 * 2
        (5.0, 2.0, None, BY_SE),
        (5.1, 2.0, None, MISS),
        (5.1, 2.0, 6.0, BY_AA),
        (5.1, 2.0, 5.0, MISS),
        (5.1, 0.0, None, MISS),
    ],
)
def test_criterion_is_the_first_one_met(diff, se, floor, met):
    assert accuracy_stats.criterion(diff, se, floor) == met


def test_aa_noise_worst_differences_floors_and_dispersion():
    first = {"a": Share(50.0, 100.0), "b": Share(10.0, 20.0)}
    second = {"a": Share(46.0, 100.0), "b": Share(10.0, 26.0)}
    noise = accuracy_stats.aa_noise(first, 100, second, 100, ["a", "b", "c"])
    assert (noise.self_worst, noise.total_worst) == (4.0, 6.0)
    assert noise.self_floor == pytest.approx(4 / math.sqrt(2))
    assert noise.total_floor == pytest.approx(6 / math.sqrt(2))
    assert noise.truth_floor == pytest.approx(3.0)
    # Observed: 4^2 + 0 (a) and 0 + 6^2 (b); binomial: a self 25 + 24.84, a total 0 + 0,
    # b self 9 + 9, b total 16 + 19.24; c is in neither half.
    assert noise.dispersion == pytest.approx(52 / 103.08)


def test_aa_noise_of_identical_halves_of_nothing_but_one_function():
    whole = {"a": Share(100.0, 100.0)}
    noise = accuracy_stats.aa_noise(whole, 10, whole, 10, ["a"])
    assert noise == Noise(0.0, 0.0, None)


def test_judge_against_the_reference():
    row = Row("m:f", Share(50.0, 80.0), Share(45.0, 70.0))
    judgement = accuracy_stats.judge(row, 2500, 2500)
    # self: 5 points, SE sqrt(50*50/2500 + 45*55/2500) = sqrt(1.99); 2.5 SE is 3.53
    assert judgement.self.diff == pytest.approx(5.0)
    assert judgement.self.se == pytest.approx(math.sqrt(1.99))
    assert judgement.self.z == pytest.approx(5.0 / math.sqrt(1.99))
    assert judgement.self.met == MISS
    assert judgement.total.diff == pytest.approx(10.0)
    assert judgement.total.met == MISS
    assert judgement.missed
    # The same with an A/A noise floor of 8 / sqrt(2) = 5.66 self, 12 / sqrt(2) = 8.49 total.
    judgement = accuracy_stats.judge(row, 2500, 2500, Noise(8.0, 12.0, 1.0))
    assert (judgement.self.met, judgement.total.met) == (BY_AA, MISS)


def test_judge_a_total_against_the_workloads_truth():
    row = Row("flask.app:Flask.wsgi_app", Share(0.0, 80.0), Share(0.0, 40.0))
    judgement = accuracy_stats.judge(row, 2500, 1600, truth=78.0)
    assert judgement.total.diff == pytest.approx(2.0)
    assert judgement.total.se == pytest.approx(0.8)  # sqrt(80 * 20 / 2500): fleetflame's only
    assert judgement.total.met == GOAL
    judgement = accuracy_stats.judge(row, 2500, 1600, Noise(0.0, 10.0, 1.0), truth=75.5)
    assert judgement.total.met == BY_AA  # 4.5 points, within 10 / 2 (one noisy side)
    judgement = accuracy_stats.judge(row, 2500, 1600, Noise(0.0, 10.0, 1.0), truth=70.0)
    assert judgement.total.met == MISS
    assert accuracy_stats.misses([judgement]) == [
        "flask.app:Flask.wsgi_app total +10.0 against its truth (12.5 SE)"
    ]


def test_a_leaf_is_judged_against_the_truth_in_self_too():
    # py-spy's default mode counts a thread preempted in a system call (runnable, waiting for a
    # core) as running there; the function's own CPU clock says how much it really ran.
    leaf = Row("gunicorn.util:write", Share(0.3, 0.3), Share(4.6, 4.6))
    judgement = accuracy_stats.judge(leaf, 2000, 2300, truth=0.5)
    assert judgement.self.diff == pytest.approx(-0.2) and judgement.self.met == GOAL
    assert judgement.total.diff == pytest.approx(-0.2) and judgement.total.met == GOAL
    judgement = accuracy_stats.judge(leaf, 2000, 2300, truth=4.5)
    assert accuracy_stats.misses([judgement]) == [
        "gunicorn.util:write self -4.2 against its truth (34.3 SE)",
        "gunicorn.util:write total -4.2 against its truth (34.3 SE)",
    ]
    # A function that calls others in either tool keeps its self judged against py-spy.
    caller = Row("m:f", Share(0.3, 0.5), Share(4.6, 4.6))
    judgement = accuracy_stats.judge(caller, 2000, 2300, truth=0.5)
    assert judgement.self.diff == pytest.approx(-4.3) and judgement.self.met == MISS


def test_judge_comparison_takes_the_noise_from_two_halves():
    comparison = Comparison(
        fleetflame=Profile({("m:a",): 50, ("m:b",): 50}),
        pyspy=Profile({("m:a",): 40, ("m:b",): 60}),
        renaming={},
        rows=[
            Row("m:a", Share(50.0, 50.0), Share(40.0, 40.0)),
            Row("m:b", Share(50.0, 50.0), Share(60.0, 60.0)),
        ],
        ceiling_misses=[],
    )
    halves = [Profile({("m:a",): 30, ("m:b",): 20}), Profile({("m:a",): 20, ("m:b",): 30})]
    judgements, noise = accuracy_stats.judge_comparison(comparison, halves)
    assert noise is not None and noise.self_worst == pytest.approx(20.0)
    # 10 points, SE sqrt(25 + 24) = 7: within 2.5 SE before the A/A floor is asked.
    assert [j.self.met for j in judgements] == [BY_SE, BY_SE]
    assert accuracy_stats.verdict(judgements) == "PASS"
    assert accuracy_stats.met_counts(judgements) == {BY_SE: 4}
    assert accuracy_stats.verdict(judgements, ["m:nap 14.7% > 0.5%"]) == "MISS"
    _, noise = accuracy_stats.judge_comparison(comparison, halves[:1])
    assert noise is None


def test_verdict_misses_and_worst():
    fine = Judgement(Row("m:a", Share(1, 1), Share(1, 1)), None, *[Judged(0.5, 1.0, GOAL)] * 2)
    real = Judgement(
        Row("m:b", Share(9, 9), Share(1, 1)), None, Judged(8.0, 1.0, MISS), Judged(-4, 2, BY_SE)
    )
    assert accuracy_stats.verdict([fine]) == "PASS"
    assert accuracy_stats.verdict([fine, real]) == "MISS"
    assert accuracy_stats.misses([fine, real]) == ["m:b self +8.0 (8.0 SE)"]
    assert accuracy_stats.met_counts([fine, real]) == {BY_SE: 1, MISS: 1}
    assert accuracy_stats.worst([fine, real], "total") is real
    assert accuracy_stats.worst([], "self") is None


def test_judged_z_without_a_standard_error():
    assert Judged(0.0, 0.0, GOAL).z == 0.0
    assert Judged(2.0, 0.0, GOAL).z == math.inf


def test_judgement_survives_its_document():
    judgement = accuracy_stats.judge(
        Row("m:f", Share(50.0, 80.0), Share(45.0, 70.0)), 2500, 2500, truth=79.0
    )
    document = judgement.to_document()
    assert document["truth_total"] == 79.0 and document["self_met"] == MISS
    assert Judgement.from_document(document) == judgement


def test_truth_shares_from_the_workloads_clocks_around_a_window():
    before = {
        "process_cpu_seconds": 10.0,
        "sampler_cpu_seconds": 1.0,
        "functions_cpu_seconds": {"w": 5.0},
    }
    after = {
        "process_cpu_seconds": 30.0,
        "sampler_cpu_seconds": 2.0,
        "functions_cpu_seconds": {"w": 22.1, "new": 1.9},
    }
    # 19 CPU seconds the tools could see: 17.1 in w, 1.9 in new.
    assert accuracy_stats.truth_shares(before, after) == {
        "w": pytest.approx(90.0),
        "new": pytest.approx(10.0),
    }
    assert accuracy_stats.truth_shares(after, after) == {}


def test_the_goal_is_the_harness_goal():
    assert accuracy_stats.GOAL_POINTS is accuracy_compare.GOAL_POINTS == 3.0
