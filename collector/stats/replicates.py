"""Replicates: each profile of one side of a comparison as a row of per-function counts.

A replicate is one profile (an instance's bucket in the store, one folded file on the command
line). Its row holds, for every function (frame name, escaped as in folded text), the samples
where the function is the leaf (self) and the samples whose stack holds it at least once
(total), counted by ``collector.functions``; and the replicate's own samples.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from scipy import sparse

from sampler.profile import split_frames

__all__ = ["Replicates", "replicates_of"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, eq=False)
class Replicates:
    """One side's replicates: self and total samples per replicate (row) and function (column),
    and each replicate's samples."""

    functions: tuple[str, ...]
    self_counts: np.ndarray  # int64, (replicates, functions)
    total_counts: np.ndarray  # int64, (replicates, functions)
    samples: np.ndarray  # int64, (replicates,)

    def __post_init__(self) -> None:
        shape = (len(self.samples), len(self.functions))
        if self.self_counts.shape != shape or self.total_counts.shape != shape:
            raise ValueError(
                f"counts of shape {self.self_counts.shape} and {self.total_counts.shape} "
                f"for {shape[0]} replicates of {shape[1]} functions"
            )

    @property
    def size(self) -> int:
        """The number of replicates."""
        return len(self.samples)

    @classmethod
    def from_arrays(
        cls,
        functions: Sequence[str],
        self_counts: object,
        total_counts: object,
        samples: object = None,
    ) -> Replicates:
        """Returns replicates from count matrices (rows replicates, columns ``functions``);
        each replicate's samples are its self counts' sum unless given."""
        self_array = np.asarray(self_counts, dtype=np.int64)
        return cls(
            tuple(functions),
            self_array,
            np.asarray(total_counts, dtype=np.int64),
            self_array.sum(axis=1) if samples is None else np.asarray(samples, dtype=np.int64),
        )


def replicates_of(
    *sides: Sequence[Mapping[K, int]],
    frames: Callable[[K], Sequence[str]] = split_frames,  # type: ignore[assignment]
) -> tuple[Replicates, ...]:
    """Returns each side's profiles (folded stack -> count) as Replicates over the functions of
    all sides, in one order. A profile without samples says nothing about shares: it is left
    out (compare ``Replicates.size`` with the number of profiles given).

    A profile's keys may be anything ``frames`` turns into the stack's frames, root first (the
    store's stack ids, say): each distinct stack is split once, however many profiles hold
    it. The counts are then two sparse products, replicates x stacks times stacks x functions
    (the stack's leaf for self; each function it holds, once, for total): a side of 150
    replicates of 2,000 stacks 35 frames deep in a few tens of milliseconds. Non-positive
    counts are left out; an empty frame name (the empty stack, ``a;;b``) is no function.
    """
    kept = [[p for p in side if sum(c for c in p.values() if c > 0) > 0] for side in sides]
    stacks: dict[K, int] = {}
    for side in kept:
        for profile in side:
            for key, count in profile.items():
                if count > 0 and key not in stacks:
                    stacks[key] = len(stacks)
    held, leaves = [], []
    for key in stacks:
        split = frames(key)
        held.append([f for f in dict.fromkeys(reversed(split)) if f])
        leaves.append(split[-1] if split else "")
    names = sorted({name for functions in held for name in functions})
    column = {name: i for i, name in enumerate(names)}
    shape = (len(stacks), len(names))
    total_of = _incidence([[column[f] for f in functions] for functions in held], shape)
    leaf_of = _incidence([[column[leaf]] if leaf else [] for leaf in leaves], shape)
    result = []
    for side in kept:
        rows, columns, counts = [], [], []
        for row, profile in enumerate(side):
            for key, count in profile.items():
                if count > 0:
                    rows.append(row)
                    columns.append(stacks[key])
                    counts.append(count)
        matrix = sparse.csr_array(
            (np.array(counts, dtype=np.int64), (rows, columns)), shape=(len(side), len(stacks))
        )
        result.append(
            Replicates(
                tuple(names),
                _dense(matrix @ leaf_of, len(side), len(names)),
                _dense(matrix @ total_of, len(side), len(names)),
                np.asarray(matrix.sum(axis=1), dtype=np.int64).reshape(len(side)),
            )
        )
    return tuple(result)


def _incidence(columns: list[list[int]], shape: tuple[int, int]) -> sparse.csr_array:
    """A 0/1 matrix with a row per stack and a one in each column it lists."""
    rows = np.repeat(np.arange(len(columns)), [len(c) for c in columns])
    flat = np.fromiter((c for cs in columns for c in cs), dtype=np.int64, count=len(rows))
    return sparse.csr_array((np.ones(len(rows), dtype=np.int64), (rows, flat)), shape=shape)


def _dense(product: sparse.csr_array, rows: int, columns: int) -> np.ndarray:
    return np.asarray(product.toarray(), dtype=np.int64).reshape(rows, columns)
