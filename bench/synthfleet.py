"""Synthetic fleets with a known truth, overdispersed between replicates as real fleets are.

The truth is each leaf function's self share of the fleet's samples: heavy-tailed (Zipf), as
profiles are, from ~15% down to hundredths of a percent. Leaves are grouped under callers
(``app.modK:handle``) under one root (``app:main``), so callers have total shares and no self.

A replicate (an instance's minute) does not sample the truth itself: its own shares are drawn
around the truth, ``Dirichlet(concentration * truth)``, and then its samples from its shares,
``Multinomial(samples, shares)``. A share then varies between replicates by
``p(1 - p) (1 / samples + 1 / (concentration + 1))`` (about), more than sample counting
(``p(1 - p) / samples``) explains: at 6,000 samples and a concentration of 2,000, four times
more. With ``instance_concentration``, each instance draws its own shares around the truth
first and its minutes around those: instances that differ for good (a host, a shard).

Used by tests/stats (through tests/stats/conftest.py) and bench/bench_compare.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from collector.stats import Replicates

ROOT = "app:main"


@dataclass(frozen=True, eq=False)
class Truth:
    """Each leaf function's self share (summing to 1) and its caller."""

    leaves: tuple[str, ...]
    callers: tuple[str, ...]  # per leaf
    shares: np.ndarray

    @property
    def functions(self) -> tuple[str, ...]:
        """Every function of a replicate, in its columns' order: leaves, callers, root."""
        return (*self.leaves, *sorted(set(self.callers)), ROOT)

    def index(self, name: str) -> int:
        """The column of a leaf."""
        return self.leaves.index(name)


def zipf_truth(functions: int = 150, callers: int = 10, exponent: float = 1.1) -> Truth:
    """Returns ``functions`` leaves with Zipf shares (rank ** -exponent), ``callers`` callers."""
    weights = np.arange(1, functions + 1, dtype=np.float64) ** -exponent
    leaves = tuple(f"app.mod{i % callers}:func{i}" for i in range(functions))
    return Truth(
        leaves,
        tuple(f"app.mod{i % callers}:handle" for i in range(functions)),
        weights / weights.sum(),
    )


def with_change(truth: Truth, leaf: int, points: float) -> Truth:
    """Returns the truth with one leaf's share changed by ``points`` (the others scaled so the
    shares still sum to 1)."""
    shares = truth.shares.copy()
    target = shares[leaf] + points / 100
    others = np.delete(np.arange(len(shares)), leaf)
    shares[others] *= (1 - target) / shares[others].sum()
    shares[leaf] = target
    return Truth(truth.leaves, truth.callers, shares)


def leaf_with_share(truth: Truth, percent: float) -> int:
    """The leaf whose share is nearest ``percent``."""
    return int(np.argmin(np.abs(truth.shares * 100 - percent)))


def draw(
    rng: np.random.Generator,
    truth: Truth,
    instances: int,
    buckets: int = 1,
    *,
    samples: int = 6000,
    concentration: float = 2000.0,
    instance_concentration: float = math.inf,
    spread: float = 0.0,
) -> Replicates:
    """Draws ``instances x buckets`` replicates of about ``samples`` samples each (down to
    ``1 - spread`` of it, uniformly), overdispersed by ``concentration`` (inf: none)."""
    n = instances * buckets
    shares = np.repeat(_around(rng, truth.shares, instance_concentration, instances), buckets, 0)
    shares = _around(rng, shares, concentration, n)
    sizes = np.round(samples * (1 - spread * rng.random(n))).astype(np.int64)
    leaf_counts = rng.multinomial(sizes, shares)
    return replicates_of_leaves(truth, leaf_counts)


def _around(rng: np.random.Generator, shares: np.ndarray, concentration: float, n: int):
    if math.isinf(concentration):
        return np.broadcast_to(shares, (n, shares.shape[-1])).copy()
    # Gamma draws, not rng.dirichlet: a row of alphas per replicate in one call.
    gammas = rng.standard_gamma(np.broadcast_to(concentration * shares, (n, shares.shape[-1])))
    return gammas / gammas.sum(axis=1, keepdims=True)


def replicates_of_leaves(truth: Truth, leaf_counts: np.ndarray) -> Replicates:
    """Returns replicates from leaf sample counts (rows replicates, columns leaves)."""
    callers = sorted(set(truth.callers))
    membership = np.zeros((len(truth.leaves), len(callers)), dtype=np.int64)
    membership[np.arange(len(truth.leaves)), [callers.index(c) for c in truth.callers]] = 1
    n = len(leaf_counts)
    samples = leaf_counts.sum(axis=1)
    self_counts = np.hstack([leaf_counts, np.zeros((n, len(callers) + 1), dtype=np.int64)])
    total_counts = np.hstack([leaf_counts, leaf_counts @ membership, samples[:, None]])
    return Replicates.from_arrays(truth.functions, self_counts, total_counts, samples)


def profiles(truth: Truth, replicates: Replicates) -> list[dict[str, int]]:
    """Returns each replicate as a profile: folded stack ``root;caller;leaf`` -> count."""
    stacks = [
        f"{ROOT};{caller};{leaf}" for leaf, caller in zip(truth.leaves, truth.callers, strict=True)
    ]
    leaves = replicates.self_counts[:, : len(truth.leaves)]
    return [
        {stack: int(count) for stack, count in zip(stacks, row, strict=True) if count > 0}
        for row in leaves
    ]
