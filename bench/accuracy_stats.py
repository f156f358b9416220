"""How far apart two estimates of a share may be by chance, and which differences are real.

A tool's share of a function is a count of ``n`` samples; were the samples independent draws
(binomial), the share ``p`` would have a standard error of ``sqrt(p(1-p)/n)``, and the
difference of two tools' shares ``sqrt(p1(1-p1)/n1 + p2(1-p2)/n2)``. With 2,400 samples per
tool, a share near 50% has a standard error of ~1.0 point per tool, ~1.4 for the difference;
the worst of 20 such differences often exceeds 3 points for a perfect sampler.

Samples of one process are not independent (a workload runs in phases, a timer can keep step
with a loop), so the noise is measured too: fleetflame's window is read as two consecutive
halves, and the halves are compared with each other, the same tool on the same workload (an
A/A comparison). A half has half the samples, so the difference of the halves has twice the
variance of the difference of two whole windows: divided by sqrt(2), the worst A/A difference
over the compared functions is the noise floor of a comparison of two whole windows (divided
by 2 against an exact truth, which has no noise of its own). The dispersion, the A/A
differences' variance over the binomial one, says whether the binomial standard error holds:
about 1 for independent samples, above 1 for autocorrelated ones.

A difference is judged by the first criterion it meets: within the goal (3 points), within
2.5 standard errors, within the A/A noise floor. A difference that meets none is a miss: more
than noise explains. Data in, data out: no I/O, no clocks.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accuracy_compare import GOAL_POINTS, NO_SHARE, Comparison, Profile, Row, Share, shares

Z_LIMIT = 2.5

GOAL = "goal"
BY_SE = "SE"
BY_AA = "A/A"
MISS = "MISS"


def share_variance(percent: float, samples: int) -> float:
    """The binomial variance, in points squared, of a share of ``samples`` samples."""
    if samples <= 0:
        raise ValueError("a share of no samples has no standard error")
    return percent * (100.0 - percent) / samples


def share_se(percent: float, samples: int) -> float:
    """The binomial standard error, in points, of a share of ``samples`` samples."""
    return math.sqrt(share_variance(percent, samples))


def difference_se(a: float, a_samples: int, b: float, b_samples: int) -> float:
    """The standard error, in points, of the difference of two independent shares."""
    return math.sqrt(share_variance(a, a_samples) + share_variance(b, b_samples))


def criterion(diff: float, se: float, floor: float | None) -> str:
    """The first criterion a difference meets: the goal, 2.5 standard errors, the A/A floor."""
    size = abs(diff)
    if size <= GOAL_POINTS:
        return GOAL
    if size <= Z_LIMIT * se:
        return BY_SE
    if floor is not None and size <= floor:
        return BY_AA
    return MISS


@dataclass(frozen=True)
class Noise:
    """Fleetflame against itself: the first half of its window against the second (A/A)."""

    self_worst: float
    total_worst: float
    dispersion: float | None

    @property
    def self_floor(self) -> float:
        """The noise floor of two whole windows' self shares, in points."""
        return self.self_worst / math.sqrt(2)

    @property
    def total_floor(self) -> float:
        """The noise floor of two whole windows' total shares, in points."""
        return self.total_worst / math.sqrt(2)

    @property
    def truth_floor(self) -> float:
        """The noise floor of a whole window's total share against an exact truth."""
        return self.total_worst / 2

    def to_document(self) -> dict[str, Any]:
        """The noise as JSON-ready fields, the floors included."""
        return {
            "self_worst": self.self_worst,
            "total_worst": self.total_worst,
            "dispersion": self.dispersion,
            "self_floor": self.self_floor,
            "total_floor": self.total_floor,
        }


def aa_noise(
    first: Mapping[str, Share],
    first_samples: int,
    second: Mapping[str, Share],
    second_samples: int,
    functions: Iterable[str],
) -> Noise:
    """The A/A noise of two halves of one tool's window, over the compared ``functions``."""
    worst = {"self": 0.0, "total": 0.0}
    observed = expected = 0.0
    for name in functions:
        a, b = first.get(name, NO_SHARE), second.get(name, NO_SHARE)
        for kind, x, y in (("self", a.self, b.self), ("total", a.total, b.total)):
            worst[kind] = max(worst[kind], abs(x - y))
            observed += (x - y) ** 2
            expected += share_variance(x, first_samples) + share_variance(y, second_samples)
    return Noise(worst["self"], worst["total"], observed / expected if expected else None)


@dataclass(frozen=True)
class Judged:
    """One difference of two shares (fleetflame's minus the reference's, in points), its
    standard error, and the criterion it met."""

    diff: float
    se: float
    met: str

    @property
    def z(self) -> float:
        """The difference in standard errors."""
        if self.se:
            return abs(self.diff) / self.se
        return 0.0 if self.diff == 0 else math.inf


@dataclass(frozen=True)
class Judgement:
    """One function's shares in both tools (and the workload's truth), judged."""

    row: Row
    truth: float | None
    self: Judged
    total: Judged

    @property
    def function(self) -> str:
        """The function's name, ``module:qualname``."""
        return self.row.function

    @property
    def leaf(self) -> bool:
        """Whether neither tool saw the function call anything (see ``is_leaf``)."""
        return is_leaf(self.row)

    @property
    def missed(self) -> bool:
        """Whether its self or total difference is more than noise explains."""
        return MISS in (self.self.met, self.total.met)

    def to_document(self) -> dict[str, Any]:
        """The judgement as a flat JSON object."""
        ours, reference = self.row.fleetflame, self.row.pyspy
        return {
            "function": self.function,
            "fleetflame_self": ours.self,
            "pyspy_self": reference.self,
            "fleetflame_total": ours.total,
            "pyspy_total": reference.total,
            "truth_total": self.truth,
            **{f"self_{k}": v for k, v in vars(self.self).items()},
            **{f"total_{k}": v for k, v in vars(self.total).items()},
        }

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> Judgement:
        """Reads what ``to_document`` wrote."""
        row = Row(
            document["function"],
            Share(document["fleetflame_self"], document["fleetflame_total"]),
            Share(document["pyspy_self"], document["pyspy_total"]),
        )
        self_judged, total = (
            Judged(document[f"{kind}_diff"], document[f"{kind}_se"], document[f"{kind}_met"])
            for kind in ("self", "total")
        )
        return cls(row, document["truth_total"], self_judged, total)


def is_leaf(row: Row) -> bool:
    """Whether neither tool saw the function call anything (or saw it at all): all its time
    its own, so its self share is its total share, and a truth for the one is the truth for
    the other. (A function that calls Python code, as gunicorn's ``write`` does when it writes
    chunks, is not one: its self share is then judged against py-spy.)"""
    ours, reference = row.fleetflame, row.pyspy
    return ours.self == ours.total and reference.self == reference.total


def judge(
    row: Row,
    fleetflame_samples: int,
    pyspy_samples: int,
    noise: Noise | None = None,
    truth: float | None = None,
) -> Judgement:
    """Judges a function's self and total differences; its total against ``truth`` when the
    workload measured one (then only fleetflame's share is noisy), and its self too when
    neither tool saw it call anything (``is_leaf``)."""
    ours, reference = row.fleetflame, row.pyspy
    if truth is not None and is_leaf(row):
        self_diff = ours.self - truth
        self_se = share_se(ours.self, fleetflame_samples)
        self_floor = noise.truth_floor if noise else None
    else:
        self_diff = ours.self - reference.self
        self_se = difference_se(ours.self, fleetflame_samples, reference.self, pyspy_samples)
        self_floor = noise.self_floor if noise else None
    if truth is None:
        total_diff = ours.total - reference.total
        total_se = difference_se(ours.total, fleetflame_samples, reference.total, pyspy_samples)
        total_floor = noise.total_floor if noise else None
    else:
        total_diff = ours.total - truth
        total_se = share_se(ours.total, fleetflame_samples)
        total_floor = noise.truth_floor if noise else None
    return Judgement(
        row,
        truth,
        Judged(self_diff, self_se, criterion(self_diff, self_se, self_floor)),
        Judged(total_diff, total_se, criterion(total_diff, total_se, total_floor)),
    )


def judge_comparison(
    comparison: Comparison,
    halves: Sequence[Profile] = (),
    truths: Mapping[str, float] | None = None,
) -> tuple[list[Judgement], Noise | None]:
    """Judges every compared function; the A/A noise from fleetflame's two ``halves`` of the
    window (none without two halves that both have samples)."""
    noise = None
    if len(halves) == 2 and all(half.samples for half in halves):
        first, second = halves
        functions = [row.function for row in comparison.rows]
        noise = aa_noise(shares(first), first.samples, shares(second), second.samples, functions)
    truths = truths or {}
    judgements = [
        judge(
            row,
            comparison.fleetflame.samples,
            comparison.pyspy.samples,
            noise,
            truths.get(row.function),
        )
        for row in comparison.rows
    ]
    return judgements, noise


def verdict(judgements: Iterable[Judgement], ceiling_misses: Sequence[str] = ()) -> str:
    """PASS when every difference met a criterion and no ceiling is exceeded, else MISS."""
    return "MISS" if ceiling_misses or any(j.missed for j in judgements) else "PASS"


def misses(judgements: Iterable[Judgement]) -> list[str]:
    """The differences more than noise explains, as ``name self +5.1 (2.9 SE)``."""
    found = []
    for judgement in judgements:
        for kind, judged in (("self", judgement.self), ("total", judgement.total)):
            if judged.met == MISS:
                truth = judgement.truth is not None and (kind == "total" or judgement.leaf)
                against = " against its truth" if truth else ""
                found.append(
                    f"{judgement.function} {kind} {judged.diff:+.1f}{against} ({judged.z:.1f} SE)"
                )
    return found


def worst(judgements: Iterable[Judgement], kind: str) -> Judgement | None:
    """The judgement whose ``kind`` ("self" or "total") difference is largest, if any."""
    return max(
        judgements,
        key=lambda j: (abs(getattr(j, kind).diff), j.function),
        default=None,
    )


def met_counts(judgements: Iterable[Judgement]) -> dict[str, int]:
    """How many differences met each criterion past the goal (self and total counted apart)."""
    counts: Counter[str] = Counter()
    for judgement in judgements:
        for judged in (judgement.self, judgement.total):
            if judged.met != GOAL:
                counts[judged.met] += 1
    return {met: counts[met] for met in (BY_SE, BY_AA, MISS) if counts[met]}


def truth_shares(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, float]:
    """Each function's total share, in percent, by a workload's own clocks read before and
    after a window: its CPU seconds over the process's, less the sampler's own threads (which
    neither tool counts). The documents hold ``process_cpu_seconds``, ``sampler_cpu_seconds``
    and ``functions_cpu_seconds`` (function name to CPU seconds)."""
    basis = (after["process_cpu_seconds"] - before["process_cpu_seconds"]) - (
        after["sampler_cpu_seconds"] - before["sampler_cpu_seconds"]
    )
    if basis <= 0:
        return {}
    used_before = before["functions_cpu_seconds"]
    return {
        name: 100.0 * (seconds - used_before.get(name, 0.0)) / basis
        for name, seconds in after["functions_cpu_seconds"].items()
    }
