"""A comparison of two sides' replicates: per function and kind (self, total), the shares,
the change, its interval, p and q, whether it is judged at all, and the noise floor.

The hypotheses are a function's self share (where it has self samples) and its total share
(where that differs from its self share in some replicate: a function that calls nothing is
judged once, as self). Those with too few samples or replicates are listed, not judged. The
rest are tested with Welch's t on per-replicate shares (``welch``) and their p-values turned
into q-values together (``fdr``). Shares are reported in percent and changes in points.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sampler.profile import split_frames

from .fdr import benjamini_hochberg
from .options import Options
from .replicates import Replicates, replicates_of
from .welch import minimal_detectable_change, welch

__all__ = [
    "SELF",
    "TOTAL",
    "Comparison",
    "ComparisonError",
    "Finding",
    "NoiseFloor",
    "compare",
    "compare_replicates",
]

SELF = "self"
TOTAL = "total"


class ComparisonError(ValueError):
    """The replicates given cannot be compared; the message says what is missing."""


@dataclass(frozen=True)
class Finding:
    """One function's self or total share in A and B (percent), the change (points) and, when
    judged, its confidence interval, p, q, significance and minimal detectable change."""

    function: str  # the frame name, escaped as in folded text
    kind: str  # SELF or TOTAL
    a_share: float
    b_share: float
    change: float
    a_samples: int
    b_samples: int
    replicates: int  # replicates holding it, both sides together
    judged: bool
    ci_low: float | None = None
    ci_high: float | None = None
    p: float | None = None
    q: float | None = None
    significant: bool = False
    mde: float | None = None  # minimal detectable change, points

    def to_dict(self) -> dict[str, Any]:
        """Returns the finding as JSON-ready fields."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class NoiseFloor:
    """How large changes look by chance in this comparison, and the smallest one it detects.

    ``largest_change`` is the median, over ``splits`` A/A splits of the replicates (each half
    holding half of A's and half of B's), of the largest change among the judged functions;
    ``significant_splits`` counts the splits that found a significant change (about ``fdr``
    of them when the test holds its rate). ``mde`` is the change detected with probability
    ``power`` at level ``alpha`` (the false discovery rate over the number judged: the p-value
    one regression among unchanged functions needs), the median over the ``mde_functions``
    judged self shares that vary between replicates (their range ``mde_low`` to
    ``mde_high``); over the judged totals where no self share is judged. Totals alone read
    ~100 points beside significant 21-point changes in a fleet of two kinds of worker: each
    kind's own start-up frames hold ~100% of its replicates and 0% of the other's.
    ``dispersion`` is how many times more a share varies between replicates than sample
    counting explains (1: samples as good as independent draws), fitted over all functions.
    """

    splits: int
    largest_change: float | None
    significant_splits: int
    mde: float | None
    mde_functions: int
    mde_low: float | None
    mde_high: float | None
    alpha: float | None
    power: float
    dispersion: float | None

    def to_dict(self) -> dict[str, Any]:
        """Returns the noise floor as JSON-ready fields."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class Comparison:
    """The findings of a comparison, ranked (judged ones by q, then the rest), its noise
    floor, and the replicates and samples of each side."""

    findings: tuple[Finding, ...]
    noise_floor: NoiseFloor
    a_replicates: int
    b_replicates: int
    a_samples: int
    b_samples: int
    options: Options

    @property
    def judged(self) -> int:
        """The number of hypotheses judged (the size of the false discovery rate's family)."""
        return sum(f.judged for f in self.findings)

    def regressions(self, fail_above: float | None = None) -> list[Finding]:
        """Returns the significant findings whose share rose by more than ``fail_above``
        points (the options' ``fail_above`` by default)."""
        threshold = self.options.fail_above if fail_above is None else fail_above
        return [f for f in self.findings if f.significant and f.change > threshold]

    def to_dict(self) -> dict[str, Any]:
        """Returns the comparison as JSON-ready fields: findings, noise floor, replicates."""
        return {
            "findings": [f.to_dict() for f in self.findings],
            "noise_floor": self.noise_floor.to_dict(),
            "replicates": {
                "a": self.a_replicates,
                "b": self.b_replicates,
                "a_samples": self.a_samples,
                "b_samples": self.b_samples,
            },
            "options": dict(self.options.__dict__),
        }


def compare(
    a: Sequence[Mapping[Any, int]],
    b: Sequence[Mapping[Any, int]],
    options: Options | None = None,
    *,
    frames: Callable[[Any], Sequence[str]] = split_frames,
) -> Comparison:
    """Compares two sides, each a sequence of profiles (folded stack -> count, or any key
    ``frames`` splits into the stack's frames), one profile a replicate; profiles without
    samples are left out."""
    a_replicates, b_replicates = replicates_of(a, b, frames=frames)
    return compare_replicates(a_replicates, b_replicates, options)


@dataclass(frozen=True, eq=False)
class _Family:
    """The hypotheses: which function and kind each column is, and its counts on each side."""

    names: list[str]
    kinds: list[str]
    a: np.ndarray
    b: np.ndarray

    @classmethod
    def of(cls, a: Replicates, b: Replicates) -> _Family:
        has_self = (a.self_counts.sum(axis=0) + b.self_counts.sum(axis=0)) > 0
        has_callees = (a.total_counts != a.self_counts).any(axis=0) | (
            b.total_counts != b.self_counts
        ).any(axis=0)
        self_columns, total_columns = np.flatnonzero(has_self), np.flatnonzero(has_callees)
        names = [a.functions[i] for i in self_columns] + [a.functions[i] for i in total_columns]
        kinds = [SELF] * len(self_columns) + [TOTAL] * len(total_columns)
        return cls(
            names,
            kinds,
            np.hstack([a.self_counts[:, self_columns], a.total_counts[:, total_columns]]),
            np.hstack([b.self_counts[:, self_columns], b.total_counts[:, total_columns]]),
        )


def compare_replicates(a: Replicates, b: Replicates, options: Options | None = None) -> Comparison:
    """Compares two sides' replicates over the same functions (``replicates_of`` makes them)."""
    options = options or Options()
    if a.functions != b.functions:
        raise ValueError("both sides' replicates must list the same functions in one order")
    for side, replicates in (("A", a), ("B", b)):
        if replicates.size < 2:
            raise ComparisonError(
                f"side {side} has {replicates.size} profile(s) with samples: a comparison needs "
                "at least 2 per side, since the variation between them is what tells a change "
                "from noise"
            )
    family = _Family.of(a, b)
    a_total, b_total = int(a.samples.sum()), int(b.samples.sum())
    a_sums, b_sums = family.a.sum(axis=0), family.b.sum(axis=0)
    holding = (family.a > 0).sum(axis=0) + (family.b > 0).sum(axis=0)
    # Were the share the same on both sides, each side would hold this many of its samples:
    # below ``min_samples`` the smaller side's share is too skewed a sum for the t test.
    expected = (a_sums + b_sums) * min(a_total, b_total) / (a_total + b_total)
    judged = (expected >= options.min_samples) & (holding >= options.min_replicates)
    columns = np.flatnonzero(judged)
    test = welch(
        family.a[:, columns], a.samples, family.b[:, columns], b.samples, options.confidence
    )
    q = benjamini_hochberg(test.p)
    alpha = options.fdr / len(columns) if len(columns) else None
    mde = (
        minimal_detectable_change(test.se, test.df, alpha, options.power)
        if alpha is not None
        else np.empty(0)
    )
    position = {column: i for i, column in enumerate(columns)}
    findings = []
    for column, (name, kind) in enumerate(zip(family.names, family.kinds, strict=True)):
        a_share, b_share = 100 * a_sums[column] / a_total, 100 * b_sums[column] / b_total
        common = dict(
            function=name,
            kind=kind,
            a_share=float(a_share),
            b_share=float(b_share),
            change=float(b_share - a_share),
            a_samples=int(a_sums[column]),
            b_samples=int(b_sums[column]),
            replicates=int(holding[column]),
        )
        i = position.get(column)
        if i is None:
            findings.append(Finding(judged=False, **common))
            continue
        findings.append(
            Finding(
                judged=True,
                ci_low=float(100 * test.ci_low[i]),
                ci_high=float(100 * test.ci_high[i]),
                p=float(test.p[i]),
                q=float(q[i]),
                significant=bool(q[i] <= options.fdr),
                mde=float(100 * mde[i]),
                **common,
            )
        )
    findings.sort(key=_rank)
    floor = _noise_floor(family, columns, a.samples, b.samples, options, mde, alpha)
    if test.prior is not None:
        floor = dataclasses.replace(floor, dispersion=test.prior.dispersion)
    return Comparison(tuple(findings), floor, a.size, b.size, a_total, b_total, options)


def _rank(finding: Finding) -> tuple[Any, ...]:
    if finding.judged:
        return (0, finding.q, finding.p, -abs(finding.change), finding.function, finding.kind)
    total = finding.a_samples + finding.b_samples
    return (1, 0.0, 0.0, -total, finding.function, finding.kind)


def _noise_floor(
    family: _Family,
    columns: np.ndarray,
    a_samples: np.ndarray,
    b_samples: np.ndarray,
    options: Options,
    mde: np.ndarray,
    alpha: float | None,
) -> NoiseFloor:
    """Splits the replicates in two halves, each holding half of A's and half of B's, so that
    no change is real, and compares the halves as the real comparison was."""
    splits = options.splits if len(columns) else 0
    # A share the same in every replicate (a root's total, always 100%) has no variation to
    # measure a detectable change against: 0 there says nothing, and pulled the median down.
    is_self = np.array([family.kinds[column] == SELF for column in columns], dtype=bool)
    varying = mde[(mde > 0) & is_self] if (is_self & (mde > 0)).any() else mde[mde > 0]
    rng = np.random.default_rng(options.seed)
    a_counts, b_counts = family.a[:, columns], family.b[:, columns]
    counts = np.vstack([a_counts, b_counts])
    samples = np.concatenate([a_samples, b_samples])
    largest, alarms = [], 0
    for _ in range(splits):
        a_order, b_order = rng.permutation(len(a_samples)), rng.permutation(len(b_samples))
        a_half, b_half = len(a_order) // 2, (len(b_order) + 1) // 2
        first = np.concatenate([a_order[:a_half], len(a_order) + b_order[:b_half]])
        second = np.concatenate([a_order[a_half:], len(a_order) + b_order[b_half:]])
        test = welch(counts[first], samples[first], counts[second], samples[second])
        largest.append(float(np.abs(test.change).max()))
        alarms += bool((benjamini_hochberg(test.p) <= options.fdr).any())
    return NoiseFloor(
        splits=splits,
        largest_change=100 * float(np.median(largest)) if largest else None,
        significant_splits=alarms,
        mde=100 * float(np.median(varying)) if len(varying) else None,
        mde_functions=len(varying),
        mde_low=100 * float(varying.min()) if len(varying) else None,
        mde_high=100 * float(varying.max()) if len(varying) else None,
        alpha=alpha,
        power=options.power,
        dispersion=None,
    )
